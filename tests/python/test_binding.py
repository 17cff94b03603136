"""The ctypes binding (python/vaswap) over the simulator, and with torch on a GPU.

On the simulator, device memory is host memory at the same address, so the tests read and
write slots directly with ctypes. The torch tests run where torch sees a CUDA device."""

import ctypes
import os
import pathlib
import sys
import time

import pytest

# This checkout's python/vaswap; tests/install/install_test.sh sets VASWAP_TEST_INSTALLED=1 to
# test the package pip installed instead (and its library, found with nothing set).
if not os.environ.get("VASWAP_TEST_INSTALLED"):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
import vaswap  # noqa: E402

MiB = 1 << 20


def _cuda_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


torch = _cuda_torch()
on_simulator = os.environ.get("VASWAP_SIM_DEVICES") is not None and torch is None
needs_sim = pytest.mark.skipif(not on_simulator, reason="reads device memory from the host")
needs_torch = pytest.mark.skipif(torch is None, reason="needs torch with a CUDA device")


def wait_for(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.0005)
    return False


def released(slot):
    info = slot.info()
    return info.mapped == 0 and info.release_pending == 0


def pattern(nbytes, seed):
    return bytes((i * 131 + seed) & 0xFF for i in range(nbytes))


@needs_sim
def test_slot_has_a_granularity_aligned_address_and_one_handle():
    slot = vaswap.Slot(nbytes=5 * MiB)
    info = slot.info()
    assert info.va % (2 * MiB) == 0
    assert info.bytes == 5 * MiB
    assert info.mapped_bytes == 6 * MiB
    assert slot.mapped
    slot.close()
    with pytest.raises(vaswap.VaswapError) as e:
        slot.info()
    assert "closed" in e.value.message


def filled_slot(nbytes, seed):
    """A slot whose first 4 KiB hold pattern(4096, seed), a host buffer for it, and the bytes."""
    slot = vaswap.Slot(nbytes=nbytes)
    host = vaswap.HostBuffer(nbytes)
    data = pattern(4096, seed)
    ctypes.memmove(slot.address, data, len(data))
    return slot, host, data


@needs_sim
def test_offload_and_restore_keep_address_and_bytes():
    slot, host, data = filled_slot(4 * MiB, 7)
    address = slot.address
    free_mapped, _ = vaswap.memory_info(0)
    vaswap.offload_after([slot], [host])
    assert wait_for(lambda: released(slot))
    assert vaswap.memory_info(0)[0] - free_mapped == 4 * MiB
    assert ctypes.string_at(host.address, len(data)) == data
    with vaswap.remap_and_copy_after([slot], [host]) as remap:
        remap.wait()
        remap.adopt()
    assert slot.address == address
    assert vaswap.memory_info(0)[0] == free_mapped
    assert wait_for(lambda: vaswap.stats()["bytes_restored"] >= 4 * MiB)
    assert ctypes.string_at(address, len(data)) == data


@needs_sim
def test_page_reuse_keeps_the_pages_for_the_next_remap():
    slot, host, data = filled_slot(4 * MiB, 9)
    free_mapped, _ = vaswap.memory_info(0)
    vaswap.set_page_reuse(4 * MiB)
    try:
        vaswap.offload_after([slot], [host])
        assert wait_for(lambda: released(slot))
        assert vaswap.memory_info(0)[0] == free_mapped  # kept, not given back
        with vaswap.remap_and_copy_after([slot], [host]) as remap:
            remap.wait()
            remap.adopt()
        assert vaswap.memory_info(0)[0] == free_mapped  # the kept handle, no new one
        assert ctypes.string_at(slot.address, len(data)) == data
        vaswap.offload_after([slot], [host])
        assert wait_for(lambda: released(slot))
    finally:
        vaswap.set_page_reuse(0)
    assert vaswap.memory_info(0)[0] - free_mapped == 4 * MiB  # released with the limit


@needs_sim
def test_deferred_remap_copies_only_when_launched():
    slot, host, data = filled_slot(2 * MiB, 99)
    vaswap.offload_after([slot], [host])
    remap = vaswap.remap_deferred_after([slot], [host])
    assert wait_for(lambda: slot.mapped and not slot.info().release_pending)
    assert remap.try_wait() is False
    ctypes.memmove(slot.address, b"\0" * len(data), len(data))
    remap.launch_h2d(0)
    remap.wait_slot(0)
    remap.adopt()
    remap.close()
    assert ctypes.string_at(slot.address, len(data)) == data


@needs_sim
def test_errors_carry_status_and_message():
    slot = vaswap.Slot(nbytes=2 * MiB)
    slot.unmap_and_release()
    with pytest.raises(vaswap.VaswapError) as e:
        vaswap.remap_after([slot, slot])
    assert e.value.status == "VASWAP_ERROR_INVALID_ARGUMENT"
    assert "appears twice in the batch" in e.value.message
    with pytest.raises(vaswap.VaswapError) as e:
        vaswap.release_after([slot])
    assert e.value.status == "VASWAP_ERROR_INVALID_STATE"
    with pytest.raises(TypeError):
        vaswap.release_after([object()])


@needs_torch
def test_tensor_lives_at_the_slot_address_through_offload_and_graph_replay():
    slot = vaswap.Slot((256, 1024), torch.float32)
    out = torch.empty((256, 1024), dtype=torch.float32, device="cuda")
    x = slot.tensor
    assert x.data_ptr() == slot.address
    x.copy_(torch.arange(256 * 1024, dtype=torch.float32, device="cuda").reshape(256, 1024))
    host = vaswap.HostBuffer(slot.nbytes)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out.copy_(x * 2 + 1)
    torch.cuda.current_stream().wait_stream(stream)
    expected = torch.arange(256 * 1024, dtype=torch.float32, device="cuda").reshape(256, 1024)
    for cycle in range(20):
        vaswap.offload_after([slot], [host])
        with vaswap.remap_and_copy_after([slot], [host]) as remap:
            remap.wait()
            remap.adopt()  # asserts data_ptr() == address
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected * 2 + 1), cycle
        assert slot.tensor.data_ptr() == slot.address
    assert torch.equal(slot.tensor, expected)
    assert torch.equal(host.tensor(torch.float32, (256, 1024)), expected.cpu())


@needs_torch
def test_memory_info_shows_pages_given_back():
    slot = vaswap.Slot((64 * MiB // 4,), torch.float32)
    host = vaswap.HostBuffer(slot.nbytes)
    torch.cuda.synchronize()
    before, _ = vaswap.memory_info(torch.cuda.current_device())
    vaswap.offload_after([slot], [host], stream=torch.cuda.current_stream())
    assert wait_for(lambda: released(slot))
    after, _ = vaswap.memory_info(torch.cuda.current_device())
    assert after - before >= 64 * MiB
    remap = vaswap.remap_and_copy_after([slot], [host])
    remap.wait()
    remap.adopt()
    remap.close()


@needs_sim
def test_find_returns_the_slot_the_preload_made_without_owning_it():
    # A graph-pool-like allocation: cudaMalloc during a capture, in relaxed mode, through the
    # hooks libvaswap.so exports (what LD_PRELOAD would route the program's calls to).
    cudart = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
    hooks = vaswap._lib.load()
    stream = ctypes.c_void_p()
    assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
    assert hooks.cudaStreamBeginCapture(stream, 0) == 0  # global mode
    mode = ctypes.c_int(2)  # relaxed, as PyTorch's allocator switches to
    assert hooks.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    va = ctypes.c_void_p()
    assert hooks.cudaMalloc(ctypes.byref(va), ctypes.c_size_t(16 * MiB)) == 0
    assert hooks.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    graph = ctypes.c_void_p()
    assert hooks.cudaStreamEndCapture(stream, ctypes.byref(graph)) == 0

    found = vaswap.Slot.find(va.value + 4096)
    # Made during a capture, it has its address and no pages until its first use.
    assert found.address == va.value and found.nbytes == 16 * MiB and not found.mapped
    found.close()  # forgets the handle, never destroys the slot
    again = vaswap.Slot.find(va.value)
    assert again.address == va.value
    own = vaswap.Slot(nbytes=2 * MiB)  # vaswap_slot_create's slots are not the preload's
    with pytest.raises(vaswap.VaswapError) as e:
        vaswap.Slot.find(own.address)
    assert e.value.status == "VASWAP_ERROR_NOT_FOUND"
    own.close()
    assert hooks.cudaFree(va) == 0  # the program's free destroys the slot
    with pytest.raises(vaswap.VaswapError) as e:
        vaswap.Slot.find(va.value)
    assert e.value.status == "VASWAP_ERROR_NOT_FOUND"
    assert cudart.cudaGraphDestroy(graph) == 0
    assert cudart.cudaStreamDestroy(stream) == 0
