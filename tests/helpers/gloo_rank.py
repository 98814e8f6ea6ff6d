"""A rank that meets its gang over gloo (env://) and says where it ran: `RANK NODE HOST ADDR SUM`.
`CRASH_RANK=R` makes rank R exit 3 after the all_reduce."""

import os
import socket

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
host = socket.gethostname()
print(rank, os.environ["SENTINEL_NODE"], host, os.environ["MASTER_ADDR"], int(t.item()), flush=True)
dist.destroy_process_group()
if os.environ.get("CRASH_RANK") == str(rank):
    raise SystemExit(3)
