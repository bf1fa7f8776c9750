# Hosts PyTorch's own TCPStore server (the 2.x one this python has) on a free port, as torchrun's
# agent does, prints "port N" and serves until killed.
#
#   python torch2_store_host.py libuv|legacy
import datetime
import sys
import time

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                      use_libuv=sys.argv[1] == "libuv", timeout=datetime.timedelta(seconds=60))
print(f"port {store.port}", flush=True)
while True:
    time.sleep(3600)
