"""Host -> device transfer of sampled batches: pinned, double-buffered, non-blocking on CUDA.

On a CPU device a batch becomes tensors that share memory with the numpy arrays (no copy).
On CUDA each key has two page-locked host buffers used in turn: the arrays are copied into the
free one and sent with ``non_blocking=True``, so the copy overlaps with work already queued on
the GPU. Before a buffer is refilled, the event recorded after its last transfer is waited on,
so a transfer still reading it is never overwritten.

A static or captured update (:mod:`zmqrl.agents.graphs`) takes its inputs in buffers allocated once:
:meth:`BatchStager.into` fills them with ``copy_``, the same way.

A batch may hold tensors already (replay on the device, :mod:`zmqrl.replay.device`, gathers its batches
there): they are used as they are, or copied on the device, never through the host.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch


class BatchStager:
    """Turns a dict of numpy arrays into tensors on ``device``."""

    def __init__(self, device: torch.device | str, pinned: bool = True) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.pinned = self.cuda and pinned  # pinned=False: plain blocking copies (the bench's baseline)
        self._buffers: list[dict[str, torch.Tensor]] = [{}, {}]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def __call__(self, batch: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, torch.Tensor]:
        """Tensors on the device for every array of ``batch`` (same shapes and dtypes); its tensors as they are
        (moved only if on another device)."""
        arrays, out = _split(batch, self.device)
        if not self.pinned:
            staged = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
            out.update({k: t.to(self.device) for k, t in staged.items()} if self.cuda else staged)
        elif arrays:
            out.update({key: host.to(self.device, non_blocking=True) for key, host in self._pinned(arrays)})
            self._record()
        return {k: out[k] for k in batch}

    def into(self, batch: Mapping[str, np.ndarray | torch.Tensor], out: Mapping[str, torch.Tensor]) -> None:
        """Copy every array of ``batch`` into the device tensor of ``out`` under its key (same shapes;
        dtypes as the tensors'), in the order of the device's stream: on CUDA through the pinned
        buffers, without waiting; its tensors straight from where they are."""
        arrays, tensors = _split(batch, self.device)
        for key, tensor in tensors.items():
            out[key].copy_(tensor, non_blocking=True)
        if not self.pinned:
            for key, array in arrays.items():
                out[key].copy_(torch.from_numpy(np.ascontiguousarray(array)))
            return
        if arrays:
            for key, host in self._pinned(arrays):
                out[key].copy_(host, non_blocking=True)
            self._record()

    def _pinned(self, batch: Mapping[str, np.ndarray]) -> Iterator[tuple[str, torch.Tensor]]:
        """Each array of ``batch`` copied into this turn's page-locked buffer for its key (one at a time, so
        the transfer of one overlaps the copy of the next), once the last transfer out of them is done."""
        turn = self._turn
        self._turn ^= 1
        event = self._events[turn]
        if event is not None:
            event.synchronize()  # the last transfer out of this buffer has finished reading it
        buffers = self._buffers[turn]
        for key, array in batch.items():
            yield key, self._host_buffer(buffers, key, np.asarray(array))

    def _record(self) -> None:
        """An event after the transfers just queued, for the turn that used the buffers."""
        done = torch.cuda.Event()
        done.record()
        self._events[self._turn ^ 1] = done

    @staticmethod
    def _host_buffer(buffers: dict[str, torch.Tensor], key: str, array: np.ndarray) -> torch.Tensor:
        """``array`` copied into this turn's pinned buffer for ``key`` (reallocated if the shape changed)."""
        buf = buffers.get(key)
        if buf is None or tuple(buf.shape) != array.shape or buf.numpy().dtype != array.dtype:
            buf = torch.from_numpy(np.empty(array.shape, dtype=array.dtype)).pin_memory()
            buffers[key] = buf
        buf.numpy()[...] = array
        return buf


def _split(batch: Mapping[str, np.ndarray | torch.Tensor],
           device: torch.device) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """``batch``'s host arrays, and its tensors moved to ``device`` (without waiting; a no-op where they are)."""
    arrays = {k: np.asarray(v) for k, v in batch.items() if not isinstance(v, torch.Tensor)}
    tensors = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return arrays, tensors
