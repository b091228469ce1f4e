"""Math answer checking (DeepScaleR-style): the final ``\\boxed{}`` answer, graded by math-verify in worker processes.

- ``answer``: the reward (answer extraction, the rules on top of math-verify, ``compute_score`` and its batch form);
- ``latex``: LaTeX that math-verify misreads, stripped or screened before it sees the answer;
- ``understood``: the whitelist of what the parser understands (nothing else is graded), restated computations;
- ``verify_pool``: the pool of math-verify worker processes with a hard wall-clock timeout per item;
- ``_worker``: the worker process itself (run as a script; stdlib and math-verify only);
- ``cases``: hand-made grading cases with their true verdicts (tests and benchmark).
"""
