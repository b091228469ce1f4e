"""Resume at an epoch boundary (verl issues #5725, #7401): verl 0.9.1's v1 trainer, which GAPO runs, continues
with the next epoch's batches, in the order an uninterrupted run sees them. Checked on verl's own code: the
trainer's batch fetch (`PPOTrainer._fetch_one_gen_batch`), its sampler (`create_rl_sampler`) and
torchdata's StatefulDataLoader, saved and restored as `_save_checkpoint` / `_load_checkpoint` do (data.pt).
The end-to-end counterpart (a real job resuming at the boundary) is tests/test_launch.py."""

import io
import types

import pytest
import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_sampler
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.utils.dataset.rl_dataset import collate_fn

N_PROMPTS, BATCH = 16, 8  # 2 steps per epoch, as in the launch test (data.train_max_samples=16)
DATA = [{"raw_prompt": f"p{i}", "index": torch.tensor(i)} for i in range(N_PROMPTS)]


def _trainer(data_config, state=None):
    """Just what `_fetch_one_gen_batch` reads, built like verl's `_create_dataloader` (drop_last, rl sampler)."""
    loader = StatefulDataLoader(dataset=DATA, batch_size=BATCH, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(data_config, DATA))
    if state is not None:
        loader.load_state_dict(state)
    return types.SimpleNamespace(train_dataloader=loader, train_dataloader_it=None)


def _steps(trainer, n):
    return [list(PPOTrainer._fetch_one_gen_batch(trainer)["raw_prompt"]) for _ in range(n)]


def _checkpoint(trainer):
    """The dataloader state as `_save_checkpoint` writes it and `_load_checkpoint` reads it back."""
    buf = io.BytesIO()
    torch.save(trainer.train_dataloader.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("saved_at", [1, 2, 3, 4])  # 2 and 4: epoch boundaries
def test_resume_continues_with_the_batches_of_an_uninterrupted_run(shuffle, saved_at):
    config = OmegaConf.create({"shuffle": shuffle, "seed": 7})
    total = 6  # three epochs
    uninterrupted = _steps(_trainer(config), total)
    first = _trainer(config)
    before = _steps(first, saved_at)
    after = _steps(_trainer(config, _checkpoint(first)), total - saved_at)
    assert before + after == uninterrupted
    assert len(after) == total - saved_at and all(len(batch) == BATCH for batch in after)


def test_restored_loader_at_an_epoch_boundary_is_exhausted_which_the_v1_fetch_absorbs():
    """Why the upstream bug existed: the first iteration of a loader restored at an epoch's end yields nothing.
    The legacy `ray_trainer` looped over it (0 steps; #5725 added a guard there); the v1 fetch catches the
    StopIteration and starts the next epoch. If a verl upgrade changes that, this test says so."""
    config = OmegaConf.create({"shuffle": True, "seed": 7})
    first = _trainer(config)
    _steps(first, N_PROMPTS // BATCH)
    state = _checkpoint(first)
    assert list(_trainer(config, state).train_dataloader) == []
    assert len(_steps(_trainer(config, state), 1)[0]) == BATCH
