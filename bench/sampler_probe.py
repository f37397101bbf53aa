#!/usr/bin/env python3
"""Where the sprite sampler's GPU time goes: the generator's UNet (src/diffusion/unet.cpp, the
defaults: base 32, attention at S/4, scale-shift norms, embedding 128) rebuilt in PyTorch, one guided DDIM pass at
32x32 (batch 2 x 1,024) timed per variant with CUDA events, and a kernel table from
torch.profiler. The same ATen and cuDNN run under `spritetorch generate`, so a variant that wins
here is a change to make there. Weights are random: the time does not depend on them.

Usage: python3 bench/sampler_probe.py [--device cuda] [--batch 2048] [--compile]
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def groups_for(c):
    return 8 if c % 8 == 0 else 1


class Norm(nn.GroupNorm):
    """GroupNorm in its weights' dtype (unet.cpp's normalise: fp32 under autocast, bf16 in a bf16
    copy), or skipped entirely when `skip`."""

    skip = False

    def forward(self, x):
        return x if Norm.skip else super().forward(x.to(self.weight.dtype))


class ResBlock(nn.Module):
    def __init__(self, cin, cout, emb):
        super().__init__()
        self.norm1, self.conv1 = Norm(groups_for(cin), cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb_proj = nn.Linear(emb, 2 * cout)  # scale and shift of norm2 (unet.cpp's default)
        self.norm2, self.conv2 = Norm(groups_for(cout), cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x)))
        scale, shift = self.emb_proj(emb)[:, :, None, None].chunk(2, 1)
        h = self.conv2(F.silu(self.norm2(h) * (1 + scale) + shift))
        return h + (self.skip(x) if self.skip is not None else x)


class Attention(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads, self.norm = heads, Norm(groups_for(c), c)
        self.qkv, self.proj = nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        d, n = c // self.heads, h * w
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, d, n).unbind(1)
        scores = (q.transpose(2, 3) @ k).float() / d**0.5
        weights = scores.softmax(-1).to(v.dtype)
        out = v @ weights.transpose(2, 3)
        return x + self.proj(out.reshape(b, c, h, w))


class UNet(nn.Module):
    def __init__(self, base=32, emb=128, classes=13, attention=True, upsample="repeat"):
        super().__init__()
        c1, c2, e = base, 2 * base, emb
        self.emb, self.upsample = emb, upsample
        self.time1, self.time2 = nn.Linear(e, e), nn.Linear(e, e)
        self.class_embed = nn.Embedding(classes + 1, e)
        self.in_conv = nn.Conv2d(4, c1, 3, padding=1)
        self.block1 = ResBlock(c1, c1, e)
        self.down1 = nn.Conv2d(c1, c1, 3, stride=2, padding=1)
        self.block2 = ResBlock(c1, c2, e)
        self.down2 = nn.Conv2d(c2, c2, 3, stride=2, padding=1)
        self.mid1 = ResBlock(c2, c2, e)
        self.mid_attn = Attention(c2, max(1, c2 // 32)) if attention else None
        self.mid2 = ResBlock(c2, c2, e)
        self.up2 = ResBlock(2 * c2, c2, e)
        self.up1 = ResBlock(c2 + c1, c1, e)
        self.out_norm = Norm(groups_for(c1), c1)
        self.out_conv = nn.Conv2d(c1, 4, 3, padding=1)

    def up(self, x):
        if self.upsample == "repeat":  # what unet.cpp does
            return x.repeat_interleave(2, 2).repeat_interleave(2, 3)
        return F.interpolate(x, scale_factor=2, mode="nearest")

    def forward(self, x, t, c):
        half = self.emb // 2
        freqs = torch.exp(torch.arange(half, device=x.device) * (-torch.log(torch.tensor(10000.0)) / half))
        args = t.float()[:, None] * freqs[None]
        dtype = self.in_conv.weight.dtype  # as unet.cpp: inputs cast to the weights' dtype
        emb = self.time2(F.silu(self.time1(torch.cat([args.sin(), args.cos()], 1).to(dtype))))
        x = x.to(dtype)
        emb = F.silu(emb + self.class_embed(c))
        h0 = self.in_conv(x)
        h1 = self.block1(h0, emb)
        h2 = self.block2(self.down1(h1), emb)
        m = self.mid1(self.down2(h2), emb)
        if self.mid_attn is not None:
            m = self.mid_attn(m)
        m = self.mid2(m, emb)
        u2 = self.up2(torch.cat([self.up(m), h2], 1), emb)
        u1 = self.up1(torch.cat([self.up(u2), h1], 1), emb)
        return self.out_conv(F.silu(self.out_norm(u1)))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_pass(net, x, t, c, dtype, repeats):
    """Median seconds of one no-grad UNet pass (after warm-up passes that include cuDNN's search)."""
    device = x.device
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        for _ in range(3):
            net(x, t, c)
        sync(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            net(x, t, c)
            sync(device)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=2048, help="images a pass (guidance doubles 1,024)")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--compile", action="store_true", help="also time torch.compile (a ceiling)")
    p.add_argument("--profile", action="store_true", help="kernel tables of fp32 and the bf16 copy (NCHW)")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.manual_seed(0)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # as generate does
        print(torch.cuda.get_device_name(), "torch", torch.__version__, "cudnn",
              torch.backends.cudnn.version(), "tf32 cudnn", torch.backends.cudnn.allow_tf32,
              "tf32 matmul", torch.backends.cuda.matmul.allow_tf32)
    b, s = a.batch, a.size
    flop = 0  # multiply-adds of the convolutions, counted from a forward with hooks

    def count(mod, inp, out):
        nonlocal flop
        flop += 2 * out.numel() * mod.in_channels * mod.kernel_size[0] * mod.kernel_size[1] // mod.groups

    probe = UNet()
    hooks = [m.register_forward_hook(count) for m in probe.modules() if isinstance(m, nn.Conv2d)]
    with torch.no_grad():
        probe(torch.randn(1, 4, s, s), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long))
    for h in hooks:
        h.remove()
    print(f"convolution work: {flop / 1e6:.0f} MFLOP a sprite a pass; batch {b} at {s}x{s}")

    x = torch.randn(b, 4, s, s, device=device)
    t = torch.randint(0, 1000, (b,), device=device)
    c = torch.randint(0, 14, (b,), device=device)
    variants = [
        ("fp32, channels_last (generate before)", {}, "cl", "fp32"),
        ("fp32, NCHW (generate now)", {}, "nchw", "fp32"),
        ("bf16 autocast, channels_last", {}, "cl", "bf16"),
        ("bf16 autocast, NCHW", {}, "nchw", "bf16"),
        ("bf16 copy (weights + activations), NCHW", {"bf16_copy": True}, "nchw", "fp32"),
        ("bf16 copy, channels_last", {"bf16_copy": True}, "cl", "fp32"),
        ("bf16 copy, NCHW, GroupNorm skipped", {"bf16_copy": True, "skip_norm": True}, "nchw", "fp32"),
        # What channels_last with spritetorch's NHWC GroupNorm + SiLU kernel can reach at most.
        ("bf16 copy, channels_last, GroupNorm skipped", {"bf16_copy": True, "skip_norm": True}, "cl", "fp32"),
        ("fp32, channels_last, F.interpolate", {"upsample": "interp"}, "cl", "fp32"),
        ("fp32, NCHW, F.interpolate", {"upsample": "interp"}, "nchw", "fp32"),
        ("fp32, channels_last, no attention", {"attention": False}, "cl", "fp32"),
        ("fp32, channels_last, GroupNorm skipped", {"skip_norm": True}, "cl", "fp32"),
        ("fp32, NCHW, GroupNorm skipped", {"skip_norm": True}, "nchw", "fp32"),
        ("bf16, NCHW, interpolate, GroupNorm skipped", {"skip_norm": True, "upsample": "interp"}, "nchw", "bf16"),
    ]
    results = {}
    for name, opts, fmt, dtype in variants:
        Norm.skip = opts.pop("skip_norm", False)
        copy = opts.pop("bf16_copy", False)
        net = UNet(**opts).to(device).eval()
        if copy:
            net = net.to(torch.bfloat16)
        mf = torch.channels_last if fmt == "cl" else torch.contiguous_format
        net = net.to(memory_format=mf)
        xi = x.contiguous(memory_format=mf)
        sec = time_pass(net, xi, t, c, dtype, a.repeats)
        results[name] = sec
        print(f"{name:48s} {sec * 1e3:8.2f} ms a pass  {b / sec:9.0f} images/s  "
              f"{flop * b / sec / 1e12:6.1f} TFLOP/s  -> {b / 2 / (25 * sec):7.0f} sprites/s (25 guided steps)")
    Norm.skip = False

    if a.profile and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        for label, copy in (("fp32", False), ("bf16 copy", True)):
            net = UNet().to(device).eval()
            if copy:
                net = net.to(torch.bfloat16)
            with torch.no_grad():
                for _ in range(3):
                    net(x, t, c)
                sync(device)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(2):
                        net(x, t, c)
                    sync(device)
            print(f"## kernels of 2 passes, {label}, NCHW")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=22, max_name_column_width=70))

    if a.compile:
        for dtype in ("fp32", "bf16"):
            net = UNet(upsample="interp").to(device).eval().to(memory_format=torch.channels_last)
            compiled = torch.compile(net)
            start = time.perf_counter()
            sec = time_pass(compiled, x.contiguous(memory_format=torch.channels_last), t, c, dtype, a.repeats)
            print(f"torch.compile {dtype:5s} channels_last {sec * 1e3:8.2f} ms a pass  {b / sec:9.0f} images/s "
                  f"-> {b / 2 / (25 * sec):7.0f} sprites/s (compile + timing {time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
