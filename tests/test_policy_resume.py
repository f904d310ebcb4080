"""Sampler states written before the policy plug-ins still resume: each golden case's
`sampler_state_step2` (tests/golden/batches.json, recorded on 1728807; bestfit's settings name
`train.packing_buffer`, read as `data.packing_buffer` by config.migrate) is loaded into today's
sampler, built as that case's run builds it, and the next batch served holds the chunks the old code
served at step 3."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from helpers import SHARED_CACHE, module_cache_root
from test_golden_batches import CASES, COMMON, GOLDEN

from pretrain.config import load_config, to_config, upgrade_sampler_state
from pretrain.data.batching.policies import PolicySettings
from pretrain.data.batching.samplers import STATE_VERSION, build_sampler
from pretrain.data.ingest.cache import CacheSpec
from pretrain.data.ingest.prepare import prepare_cache

cache_root = module_cache_root(SHARED_CACHE)


def _sampler(name: str, tmp_path):
    config = to_config(load_config([*COMMON, *CASES[name], f"output_dir={tmp_path}"]))
    settings = PolicySettings.from_config(config.data, config.train, config.seed)
    cache = prepare_cache(CacheSpec.from_config(config), progress=False)
    return build_sampler(settings, cache.split("train"), packs_dir=cache.packs_dir), settings


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_state_saved_before_the_plugins_resumes_at_the_next_batch(tmp_path, cache_root, name):
    golden = json.loads(GOLDEN.read_text())[name]
    old_state = golden["sampler_state_step2"]
    assert old_state["version"] == 2 < STATE_VERSION  # a rank cursor: read as cursor x world x batch_size
    sampler, settings = _sampler(name, tmp_path)
    sampler.load_state_dict(upgrade_sampler_state(copy.deepcopy(old_state)))
    batches = iter(sampler)
    served = [np.asarray(next(batches).meta["chunks"]).tolist() for _ in range(settings.accumulation)]
    assert served == golden["chunks"][2]  # step 3's microbatches, chunk for chunk
    saved_keys = set(upgrade_sampler_state(old_state)["settings"])
    # The same settings, today's names, less the sizes a global position no longer depends on.
    assert set(sampler.state_dict()["settings"]) == saved_keys - {"train.batch_size"}
    step = settings.batch_size * settings.accumulation  # units of one update on one rank
    assert sampler.state_dict()["units"] == old_state["cursor"] * settings.batch_size + step


def test_an_old_state_with_another_buffer_is_refused_naming_the_new_key(tmp_path, cache_root):
    state = copy.deepcopy(json.loads(GOLDEN.read_text())["bestfit"]["sampler_state_step2"])
    assert state["settings"].pop("train.packing_buffer") == 64
    state["settings"]["train.packing_buffer"] = 32
    sampler, _ = _sampler("bestfit", tmp_path)
    with pytest.raises(ValueError, match=r"data\.packing_buffer: 32 -> 64"):
        sampler.load_state_dict(upgrade_sampler_state(state))  # as the run reads a checkpoint's
