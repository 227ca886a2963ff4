"""The Trainer's TrainState: what trainer.json holds, read back exactly, and older files read with defaults;
older configs' run-time keys (lr_in_use, warmup_in_use) dropped when read."""

import json

from common.config import TrainConfig
from common.train_state import TrainState


def test_the_state_round_trips_through_json_exactly():
    state = TrainState("vit", "tiny", step=25, epoch=1, samples_in_epoch=192, best=[0.5, 1], best_step=22,
                       history=[0.5], metrics={"accuracy": 0.5}, curves={"train/loss": [[5, 2.3]]},
                       commits=["abc"], lr=3e-3, warmup_steps=20, scheduler={"last_epoch": 25}, scaler={})
    saved = json.loads(json.dumps(state.state_dict()))
    loaded = TrainState("", "")
    loaded.load_state_dict(saved)
    assert loaded == state and loaded.state_dict() == saved


def test_an_older_trainer_json_loads_with_defaults_and_keeps_what_no_field_holds():
    old = {"paper": "vit", "flavor": "tiny", "step": 10, "epoch": 0, "samples_in_epoch": 640, "best": None,
           "history": [], "padding": [0, 0], "elements": 0, "data_wait_seconds": 0.0, "train_seconds": 1.0,
           "wall_seconds": 2.0, "wandb_run_id": None, "scheduler": {"last_epoch": 10}, "scaler": {},
           "world_size": 1, "optimizer_values": {"optim.param_groups.0.lr": 1e-3}, "gone_key": 7}
    state = TrainState("vit", "tiny")
    state.load_state_dict(old)
    assert (state.step, state.samples_in_epoch, state.scheduler) == (10, 640, {"last_epoch": 10})
    assert (state.commits, state.skipped_steps, state.metrics, state.best_step, state.curves) == ([], 0, {}, None, {})
    assert state.extra == {"world_size": 1, "optimizer_values": {"optim.param_groups.0.lr": 1e-3}, "gone_key": 7}
    assert state.state_dict().items() >= old.items()


def test_an_older_config_with_run_time_values_still_loads_and_a_new_one_has_none():
    cfg = TrainConfig.from_dict({"paper": "vit", "lr_in_use": 1e-3, "warmup_in_use": 5})
    assert cfg.paper == "vit" and not {"lr_in_use", "warmup_in_use"} & set(cfg.to_dict())
