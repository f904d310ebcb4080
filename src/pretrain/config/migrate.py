"""The one home of every old key and old state: a run config or a sampler state saved by an older
pretrain (a checkpoint's) is read in today's schema here, and nowhere else."""

from __future__ import annotations

from dataclasses import fields

from omegaconf import DictConfig, OmegaConf

from .plugin_groups import GROUPS, group_schema

# Keys that moved: a run config or a sampler state's settings saved before the move are read with the
# new names.
MOVED_KEYS = {"train.packing_buffer": "data.packing_buffer"}
# Keys that some plug-ins of a group had and lost (not a sign of a config from before the group split):
# data.packing_buffer was every packing policy's validation buffer, now train.eval_packing_buffer.
LEFT_KEYS = {"data": ("packing_buffer",)}
# Options a plug-in gained after its group split that another plug-in held before it: a run config
# saved before the split (every plug-in's options in one group) drops them on upgrade.
# data.document_mask was prepacked concat's only.
GAINED_SINCE_SPLIT = {"data": {"bestfit": ("document_mask",), "firstfit": ("document_mask",)}}


def _own_keys(node: DictConfig, group: str) -> DictConfig | dict:
    """The keys of a saved plug-in group that its plug-in has an option for (the others dropped: every
    policy's options, or every source kind's, used to live in one group)."""
    schema = group_schema(OmegaConf.create({group: node}), group)
    if schema is GROUPS[group].base:
        return node
    own = {f.name for f in fields(schema)}
    if set(node) - own - set(LEFT_KEYS.get(group, ())):  # saved when the group held every plug-in's
        gained = GAINED_SINCE_SPLIT.get(group, {}).get(str(node.get(GROUPS[group].key)), ())
        own -= set(gained)  # options: these keys were another's
    return {k: v for k, v in node.items() if k in own}


def upgrade_run_config(saved: dict) -> dict:
    """A run config as an older pretrain saved it (`run_config` of a checkpoint), in today's schema:
    moved keys under their new names, and the keys of a plug-in group (data, attn, source, a mixture
    component's source) that its plug-in has no option for dropped. Today's configs pass unchanged."""
    root = OmegaConf.create(saved)
    for old, new in MOVED_KEYS.items():
        group, key = old.split(".")
        if group in root and key in root[group]:
            value = root[group].pop(key)
            if value is not None and OmegaConf.select(root, new) is None:
                OmegaConf.update(root, new, value, force_add=True)
    buffer = OmegaConf.select(root, "data.packing_buffer")
    if buffer is not None and "train" in root and "eval_packing_buffer" not in root.train:
        root.train.eval_packing_buffer = buffer  # validation packs were best fit from it, then
    for group in GROUPS:
        if isinstance(root.get(group), DictConfig):
            root[group] = _own_keys(root[group], group)
    components = OmegaConf.select(root, "mixture.components")
    for component in (components or {}).values():
        if isinstance(component.get("source"), DictConfig):
            component.source = _own_keys(component.source, "source")
    upgraded = OmegaConf.to_container(root)
    assert isinstance(upgraded, dict)
    return upgraded


def upgrade_sampler_state(state: dict) -> dict:
    """A sampler state (a checkpoint's) with the settings keys under today's names (a state saved
    before a key moved still resumes); today's states pass unchanged."""
    settings = state.get("settings")
    if not isinstance(settings, dict):
        return state
    return {**state, "settings": {MOVED_KEYS.get(k, k): v for k, v in settings.items()}}
