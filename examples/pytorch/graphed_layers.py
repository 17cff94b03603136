#!/usr/bin/env python3
"""A small transformer trained with per-layer CUDA graphs (torch.cuda.make_graphed_callables).

The job vaswap is built for, in miniature: each layer's forward and backward are captured once and
replayed every step, with PyTorch's caching allocator serving the captures from a graph pool
(cudaMalloc during capture). It needs no change to run under vaswap:

    scripts/vaswap run --trace run.jsonl -- python3 examples/pytorch/graphed_layers.py

It prints one line per step, with the loss as an exact float (hex), and can write them as JSON
(--out) so that two runs can be compared bit for bit. Deterministic algorithms are forced and
attention takes the math path, so the same command gives the same losses on the same GPU.

Started by torchrun (WORLD_SIZE > 1), it is data-parallel: each rank trains the same model on its
own GPU (LOCAL_RANK) and its own data, and the gradients are averaged with NCCL all-reduce before
every optimizer step. Each rank prints its own losses; rank 0 writes every rank's to --out.

    scripts/vaswap run --trace 'run_rank%r.jsonl' -- \
        torchrun --standalone --nproc-per-node 2 examples/pytorch/graphed_layers.py
"""

import argparse
import ctypes
import json
import os
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402


def hold_device_memory(nbytes):
    """Takes nbytes of device memory for the life of the process, outside PyTorch's allocator and
    outside anything vaswap could make a slot, whatever its policy: cudaMallocAsync from the
    default pool (stream-ordered allocations are never slots). To the job and to vaswap's auto
    budget the GPU is then that much smaller."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(name)  # the one torch loaded, found by its soname
            break
        except OSError:
            continue
    else:
        raise RuntimeError("--limit-gib: no libcudart found for cudaMallocAsync")
    pointer = ctypes.c_void_p()
    rc = cudart.cudaMallocAsync(ctypes.byref(pointer), ctypes.c_size_t(nbytes), None)
    if rc == 0:
        rc = cudart.cudaStreamSynchronize(None)
    if rc != 0:
        raise RuntimeError(f"--limit-gib: cudaMallocAsync of {nbytes} bytes failed with error {rc}")
    return pointer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sdpa", choices=("math", "default"), default="math",
                   help="attention kernels: the math path (deterministic; the default), or "
                        "PyTorch's choice (memory-efficient attention, whose backward "
                        "accumulates with atomics: see docs/INTERPOSITION.md)")
    p.add_argument("--shift-mib", type=int, default=0,
                   help="hold a cudaMalloc'd block of this size first, moving every later segment")
    p.add_argument("--limit-gib", type=float, default=0,
                   help="leave the job this much device memory: hold the rest of what is free "
                        "(one cudaMallocAsync block, made before the model, never a slot) as a "
                        "smaller GPU would")
    p.add_argument("--graph", choices=("per-layer", "whole", "iteration", "compile"),
                   default="per-layer",
                   help="per-layer: one forward and one backward graph per layer (the default); "
                        "whole: all layers graphed together, one graph each way; iteration: one "
                        "torch.cuda.graph for the whole training step (forward, loss, backward "
                        "and optimizer step), replayed with new data copied into its static "
                        "inputs; compile: all "
                        "layers through torch.compile(mode='reduce-overhead'), whose CUDA graph "
                        "trees allocate their pool's segments while warming up")
    p.add_argument("--pool", choices=("shared", "own"), default="shared",
                   help="per-layer graphs: shared: one make_graphed_callables call for all "
                        "layers, whose graphs share one memory pool (the default); own: one call "
                        "per layer, each with its own pool")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the layers' parameters and activations")
    p.add_argument("--out", help="write the losses, step times and memory figures here (JSON)")
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.graph == "iteration" and world > 1:
        p.error("--graph iteration runs on one rank (its step has no all-reduce)")
    if world > 1:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        torch.distributed.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cuda")
    torch.manual_seed(args.seed)  # the same model on every rank
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.sdpa == "math":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
    shift = torch.empty(args.shift_mib << 20, dtype=torch.uint8, device=device)  # noqa: F841
    held = 0
    if args.limit_gib > 0:
        free, _ = torch.cuda.mem_get_info()
        held = max(0, free - int(args.limit_gib * 2**30))
        hold_device_memory(held)

    dtype = getattr(torch, args.dtype)
    layers = [
        torch.nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model, dropout=0.0,
                                         batch_first=True, device=device, dtype=dtype)
        for _ in range(args.layers)
    ]
    head = torch.nn.Linear(args.d_model, args.d_model, device=device, dtype=dtype)
    params = [q for layer in layers for q in layer.parameters()] + list(head.parameters())
    optimizer = torch.optim.SGD(params, lr=1e-3)

    shape = (args.batch, args.seq, args.d_model)
    samples = tuple((torch.randn(shape, device=device, dtype=dtype, requires_grad=True),)
                    for _ in layers)
    if args.graph == "per-layer" and args.pool == "shared":
        graphed = torch.cuda.make_graphed_callables(tuple(layers), samples)
    elif args.graph == "per-layer":
        graphed = tuple(torch.cuda.make_graphed_callables(layer, sample)
                        for layer, sample in zip(layers, samples))
    elif args.graph == "whole":
        graphed = (torch.cuda.make_graphed_callables(torch.nn.Sequential(*layers), samples[0]),)
    elif args.graph == "iteration":
        graphed = ()
    else:
        graphed = (torch.compile(torch.nn.Sequential(*layers), mode="reduce-overhead"),)

    data_rng = torch.Generator(device=device)
    data_rng.manual_seed(args.seed + 1000 * rank)  # each rank its own data
    data = torch.randn((args.steps,) + shape, device=device, dtype=dtype, generator=data_rng)
    target = torch.randn((args.steps,) + shape, device=device, dtype=dtype, generator=data_rng)
    if args.graph == "iteration":
        # PyTorch's whole-network capture: warm up on a side stream, then capture one step.
        model = torch.nn.Sequential(*layers, head)
        static_x = torch.zeros(shape, device=device, dtype=dtype)
        static_t = torch.zeros(shape, device=device, dtype=dtype)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.mse_loss(model(static_x), static_t).backward()
        torch.cuda.current_stream().wait_stream(side)
        iteration = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(iteration):
            static_loss = torch.nn.functional.mse_loss(model(static_x), static_t)
            static_loss.backward()
            optimizer.step()
    losses, step_ms = [], []
    least_free = torch.cuda.mem_get_info()[0]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(args.steps):
        step_start = time.perf_counter()
        x = data[step]
        if args.graph == "iteration":
            static_x.copy_(x)
            static_t.copy_(target[step])
            iteration.replay()
            value = static_loss.item()  # waits for the step
            step_ms.append(1e3 * (time.perf_counter() - step_start))
            least_free = min(least_free, torch.cuda.mem_get_info()[0])
            losses.append(value.hex())
            print(f"step {step:3d} loss {value.hex()} ({value:.6f})", flush=True)
            continue
        if args.graph == "compile":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: its graphs may replay
        for layer in graphed:
            x = layer(x)
        loss = torch.nn.functional.mse_loss(head(x), target[step])
        # Graph trees own the gradients their backward graph wrote: they are not zeroed in place
        # (the next replay overwrites them), but dropped.
        optimizer.zero_grad(set_to_none=args.graph == "compile")
        loss.backward()
        if world > 1:
            for q in params:  # data-parallel: the mean gradient over ranks
                torch.distributed.all_reduce(q.grad, op=torch.distributed.ReduceOp.AVG)
        optimizer.step()
        value = loss.item()  # waits for the step
        step_ms.append(1e3 * (time.perf_counter() - step_start))
        least_free = min(least_free, torch.cuda.mem_get_info()[0])
        losses.append(value.hex())
        print(f"{f'rank {rank} ' if world > 1 else ''}step {step:3d} loss {value.hex()} "
              f"({value:.6f})", flush=True)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    free, total = torch.cuda.mem_get_info()
    # The caching allocator keeps what it takes: without vaswap the most in use is at a step's end.
    peak = total - min(least_free, free) - held
    if world > 1:
        every = [None] * world
        torch.distributed.all_gather_object(every, losses)
        losses = [loss for rank_losses in every for loss in rank_losses]  # rank 0's first
        torch.distributed.destroy_process_group()
        if rank != 0:
            return
    print(f"{args.steps} steps in {elapsed:.3f} s ({1e3 * elapsed / args.steps:.2f} ms/step); "
          f"device memory in use {(total - free) / 2**30:.2f} GiB (cudaMemGetInfo), at most "
          f"{peak / 2**30:.2f} GiB at a step's end besides {held / 2**30:.2f} GiB held")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "ms_per_step": 1e3 * elapsed / args.steps,
                       "step_ms": step_ms, "device_bytes_in_use": total - free,
                       "peak_bytes_at_step_end": peak, "held_bytes": held, "ranks": world,
                       "args": vars(args)},
                      f, indent=1)


if __name__ == "__main__":
    main()
