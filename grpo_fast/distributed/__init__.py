"""Multi-process training on torch.distributed (`torchrun`): the process group (context.py), the policy sharded
with FSDP2 (fsdp.py), and sharded checkpoints with torch.distributed.checkpoint (checkpoint.py)."""
