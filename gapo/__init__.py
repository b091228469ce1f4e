"""GAPO: Group Adaptive Clipping Policy Optimization (framework-agnostic core)."""
