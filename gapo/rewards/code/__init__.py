"""Code scoring (DeepCoder-style): run the answer's last Python block on the problem's tests in the sandbox.

- ``protocol``: per-source test protocol (which tests run, time limits, the prompt): the one table of defaults;
- ``score``: the reward (test parsing, batch scoring through the sandbox, ``compute_code_score``);
- ``compare``: the parent-side judge (decoding what a sandboxed program sent back, comparing it with the expected);
- ``_programs``: the programs the reward runs inside the sandbox, as source text.
The sandbox itself is ``gapo.rewards.sandbox``.
"""
