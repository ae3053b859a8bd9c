"""The engine's core: blocks, block tables, prefix cache, block manager, swap, scheduler, sequences."""
