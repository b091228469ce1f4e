"""One rank of a 2-process TRL run (torchrun, gloo on CPU) of GAPOGRPOTrainer on the tiny model, for
tests/trl_integration/test_trl_integration.py::test_two_processes_carry_the_global_groups_and_reduce_the_sums.

    python -m torch.distributed.run --nproc_per_node 2 tests/trl_integration/trl_world_size_run.py OUT MODEL_DIR

Each rank writes OUT/rank{r}.json: its generation batches before TRL's shuffle (per row: the prompt's and the
completion's real token ids, the reward this rank's reward function gave and the advantage TRL gave), every micro-batch
the loss saw (per row: the same ids, the (c, k, success) it carried and the per-token entropies of the loss's forward
pass over its real tokens), the tiny tokenizer's newline ids, and its logged gapo/* metrics.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gapo.integrations.trl import GROUP_SIZE_KEY, NUM_CORRECT_KEY, SUCCESS_KEY  # noqa: E402
from gapo.smoke.task import first_visible_char  # noqa: E402
from recipe.trl_smoke import completion_text, smoke_args, smoke_trainer  # noqa: E402


def graded(text: str, allowed: str):
    """Text-only reward, not 0/1: allowed letter 1.0, allowed digit 0.7, other digit 0.4, nothing visible None."""
    first = first_visible_char(text)
    if not first:
        return None
    if first in allowed:
        return 0.7 if first.isdigit() else 1.0
    return 0.4 if first.isdigit() else 0.0


def main(out: Path, model_dir: Path) -> None:
    rank = int(os.environ["RANK"])
    rewards: list[list] = []

    def reward(prompts, completions, allowed, **kwargs):
        scores = [graded(completion_text(c), a) for c, a in zip(completions, allowed)]
        rewards.append(scores)
        return scores

    # first moves of 2 tokens that end at a newline (the trainer computes the tokenizer's newline ids); top_k=3 makes
    # the first moves of a group repeat
    args = smoke_args(out / "trainer", "token", steps=4, per_device_train_batch_size=4, steps_per_generation=2,
                      epsilon=0.03, epsilon_high=None,
                      exploration={"entrance_tokens": 2, "entrance_until_newline": True}, top_k=3)
    trainer = smoke_trainer(model_dir, args, reward=reward, sizes=(1, 10, 24, 36, 3, 16, 30, 35))
    generations, micro_batches, entropies = [], [], []
    generate, compute = trainer._generate_and_score_completions, trainer._compute_loss
    forward = trainer._get_per_token_logps_and_entropies

    def ids(batch, i):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        return [prompt, completion]

    def spy_generate(inputs):
        batch = generate(inputs)
        generations.append([ids(batch, i) + [rewards[-1][i], batch["advantages"][i].item()]
                            for i in range(batch["completion_ids"].shape[0])])
        return batch

    def spy_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        if kwargs.get("compute_entropy"):  # the loss's forward pass (the old log-probs' pass computes none)
            entropies.append(out[1].detach().clone())
        return out

    def spy_compute(model, inputs):
        loss = compute(model, inputs)
        (entropy,) = entropies  # the one forward pass of this micro-batch's loss
        entropies.clear()
        real = inputs["completion_mask"].bool()
        micro_batches.append([ids(inputs, i) + [inputs[NUM_CORRECT_KEY][i].item(), inputs[GROUP_SIZE_KEY][i].item(),
                                                bool(inputs[SUCCESS_KEY][i]), entropy[i][real[i]].tolist()]
                              for i in range(inputs["completion_ids"].shape[0])])
        return loss

    trainer._generate_and_score_completions, trainer._compute_loss = spy_generate, spy_compute
    trainer._get_per_token_logps_and_entropies = spy_forward
    trainer.train()
    logged = [{"step": h["step"], **{k: v for k, v in h.items() if k.startswith("gapo/")}}
              for h in trainer.state.log_history]
    (out / f"rank{rank}.json").write_text(json.dumps({
        "world_size": trainer.accelerator.num_processes, "generations": generations, "micro_batches": micro_batches,
        "newline_ids": sorted(trainer._gapo_newline_ids), "logged": [h for h in logged if len(h) > 1]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
