"""One PyTorch training step as the benchmarks run it: forward under autocast (bf16/fp16, or none
for fp32), cross-entropy, backward, optimizer step; fp16 through a GradScaler. Shared by
torch_ddp_bench.py and bench/gpu/torch_cifar_gpu.py so both measure the same step."""
import torch
import torch.nn.functional as F

AMP = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def grad_scaler():
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # PyTorch 2.3+
        return torch.amp.GradScaler("cuda")
    return torch.cuda.amp.GradScaler()


def make_step(model, opt, device_type, precision, label_smoothing=0.0):
    """step(x, y) -> loss: one training step of `model` with `opt`."""
    amp = AMP[precision]
    scaler = grad_scaler() if precision == "fp16" else None

    def step(x, y):
        with torch.autocast(device_type, dtype=amp, enabled=amp is not None):
            loss = F.cross_entropy(model(x), y, label_smoothing=label_smoothing)
        opt.zero_grad(set_to_none=True)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        return loss

    return step
