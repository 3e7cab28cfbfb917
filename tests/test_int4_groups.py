"""Int4 drafts' group size (draft.group_size): rows and kernel records name it (the agreement on the embedded pair at
groups of 32 and 128: tests/test_models.py, beside its loaded model)."""

import pytest
import torch
from conftest import tiny_llama

from specbench.config import DraftConfig, PairConfig
from specbench.models.draft_kinds import DRAFT_KINDS
from specbench.models.quant import Int4Linear, kernel_choices


@pytest.mark.parametrize("kind", ["w4a16", "w4a16h8"])
def test_rows_of_two_group_sizes_never_share_a_draft_label(kind):
    labels = {
        g: DRAFT_KINDS.get(kind).row_label("t", PairConfig(), DraftConfig(kind=kind, group_size=g)) for g in (32, 128)
    }
    assert labels == {32: f"{kind}-g32(t)", 128: f"{kind}-g128(t)"}
    assert DraftConfig(kind=kind).group_size == 128  # GPTQ/AWQ's group by default, not the target's own grid
    # kinds without int4 weights keep their label whatever the field says
    assert DRAFT_KINDS.get("w8a16").row_label("t", PairConfig(), DraftConfig(kind="w8a16", group_size=32)) == "w8a16(t)"


def test_a_draft_loaded_from_config_uses_its_group_and_records_it():
    target = tiny_llama(0, dtype=torch.float32)
    for group in (32, 128):
        model, _ = DRAFT_KINDS.get("w4a16").load(
            target, PairConfig(), DraftConfig(kind="w4a16", group_size=group), None, None
        )
        assert {m.group for m in model.modules() if isinstance(m, Int4Linear)} == {group}
        assert all(key.startswith(f"int4 g{group} ") for key in kernel_choices(model))
