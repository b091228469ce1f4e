"""The exploration instruments in verl's trainer: one step's TransferQueue fields in, `gapo/explore/*` metrics out.

GAPOTrainer calls `StepExploration.step` at advantage time, on the driver, with the fields it fetched in one
`kv_batch_get` (`responses`, `prompts`, and `entropy`, which verl's old-log-prob pass wrote: no extra forward
pass, nothing in the loss). The arithmetic is `gapo.exploration`'s, shared with the TRL trainer.

Rows: verl's padding rows (batch balancing) are left out of everything; with verl's GRPO grouping by session only a
session's final output is a member of its group (entrance, coverage), as the group statistics count them
(`gapo.groups`); every real row's tokens count in the entropy means, with its session's success flag.

Debugging aid (off by default): with ``GAPO_DEBUG_EXPLORE_ROWS=DIR`` the driver appends per row what the instruments
read to ``DIR/driver.jsonl``: the step, the TransferQueue key, uid, whether the row is real and a group member, the
response's first ``entrance_tokens`` ids and length, its entropy sum and token count, its success flag and its prompt
key. tests/test_cluster_e2e.py recounts the logged metrics from these rows and verl's rollout dump.
"""

from __future__ import annotations

import json
import os

import torch

from gapo.exploration import (
    CoverageWindow,
    ExplorationConfig,
    add_sums,
    entropy_sums,
    entropy_table,
    exploration_metrics,
    first_moves,
    leading_tokens,
    newline_token_ids,
    prompt_key,
    rollout_sums,
    row_entropy_sums,
)
from gapo.groups import GroupStatistics, session_final_rows

ROWS_ENV = "GAPO_DEBUG_EXPLORE_ROWS"


class StepExploration:
    """The instruments' state across steps (the coverage window; restarts with the process) and their per-step
    computation."""

    def __init__(self, settings: ExplorationConfig):
        """Start with an empty coverage window of `settings.coverage_window` steps."""
        self.settings = settings
        self.window = CoverageWindow(settings.coverage_window)
        self.newline_ids = None  # with entrance_until_newline: from the tokenizer, at the first step

    def step(self, keys, uids, data, stats: GroupStatistics, real: torch.Tensor, sessions: bool, step: int,
             tokenizer=None) -> dict:
        """The step's `gapo/explore/*` metrics (`gapo.exploration`; the coverage window advances by one step).

        Args:
            keys: TransferQueue keys `{uid}_{session}_{index}` of the B rows.
            uids: the rows' uids (their groups).
            data: the fetched fields (a TensorDict or a dict): `responses` and `prompts` (jagged (B, *) token ids), and `entropy` (jagged
                (B, *) per-token entropy of the response) when the old-log-prob pass ran.
            stats: each row's (c, k, success) (`gapo.groups.rollout_group_statistics`).
            real: (B,) bool, not a padding row.
            sessions: groups hold each session's final output only (verl's GRPO grouping).
            step: the global step (for the debugging dump).
            tokenizer: the run's tokenizer; needed only for first moves that end at a newline.
        """
        settings = self.settings
        if settings.entrance_until_newline and self.newline_ids is None:
            self.newline_ids = newline_token_ids(tokenizer)
        final = session_final_rows(keys) if sessions else list(range(len(keys)))
        member = [bool(r) and final[i] == i for i, r in enumerate(real.tolist())]
        success = stats.success.tolist()
        lead, lengths = leading_tokens(data["responses"], settings.entrance_tokens)
        moves = first_moves(lead, self.newline_ids)
        prompts = self._prompt_keys(uids, member, data["prompts"])
        sums, seen, above = rollout_sums(uids, prompts, moves, success, member, settings.coverage_threshold)
        entropy = None
        if "entropy" in data.keys():
            entropy = row_entropy_sums(data["entropy"])
            max_count = int(stats.group_size.max().item()) if len(keys) else 0
            add_sums(sums, entropy_sums(entropy_table(*entropy, stats.success, stats.num_correct, real, max_count)))
        rows_dir = os.environ.get(ROWS_ENV)
        if rows_dir:
            self._write_rows(rows_dir, step, keys, uids, real, member, lead, lengths, entropy, success, prompts)
        return {**exploration_metrics(sums), **self.window.add(seen, above)}

    @staticmethod
    def _prompt_keys(uids, member, prompts) -> list:
        """Each member row's prompt key (`prompt_key` of its prompt's token ids), hashed once per group; None
        elsewhere."""
        if prompts.is_nested:  # slices of the values, one per group: no unbind of every row
            values, offsets = prompts.values(), prompts.offsets().tolist()

            def row(i):
                return values[offsets[i]:offsets[i + 1]]
        else:
            def row(i):
                return prompts[i]
        of_uid: dict = {}
        out = []
        for i, (uid, keep) in enumerate(zip(uids, member)):
            if keep and uid not in of_uid:
                of_uid[uid] = prompt_key(row(i))
            out.append(of_uid.get(uid) if keep else None)
        return out

    @staticmethod
    def _write_rows(folder, step, keys, uids, real, member, lead, lengths, entropy, success, prompts) -> None:
        """Append the step's per-row inputs to folder/driver.jsonl (module docstring)."""
        os.makedirs(folder, exist_ok=True)
        ent_sum, ent_tokens = (entropy[0].tolist(), entropy[1].tolist()) if entropy is not None else (None, None)
        with open(os.path.join(folder, "driver.jsonl"), "a") as out:
            for i, key in enumerate(keys):
                row = {"step": step, "key": key, "uid": uids[i], "real": bool(real[i]), "member": member[i],
                       "lead": [t for t in lead[i].tolist() if t >= 0], "length": int(lengths[i]),
                       "success": bool(success[i]), "prompt": prompts[i],
                       "entropy_sum": ent_sum[i] if ent_sum else None,
                       "entropy_tokens": ent_tokens[i] if ent_tokens else None}
                out.write(json.dumps(row) + "\n")
