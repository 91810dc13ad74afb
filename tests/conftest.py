import torch

# Two threads on a busy 2-core machine can be 100x slower per small op (see ../shared/DESIGN.md).
torch.set_num_threads(1)
