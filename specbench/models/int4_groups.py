"""Int4 group sizes: a constant both the config check (`models.draft_kinds`, import-light) and the layers
(`models.quant`, torch) read, so neither imports the other."""

INT4_GROUPS = (32, 64, 128, 256)  # int4 group sizes (draft.group_size): the ones torch's int4 kernels take
DEFAULT_INT4_GROUP = 128  # GPTQ/AWQ checkpoints' group; 32 is llama.cpp's Q4 block, the embedded target's own grid
