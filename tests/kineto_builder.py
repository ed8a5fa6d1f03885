"""Writes PyTorch profiler (Kineto) Chrome traces with known properties, for exact tests.

Times are given in microseconds, as Kineto writes them. ``launch`` makes a runtime call and
its GPU event with a shared correlation id (and the flow events Kineto adds); ``graph``
makes one ``cudaGraphLaunch`` correlated with several kernels.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

A100_80GB = {
    "id": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "totalGlobalMem": 84990623744,
    "computeMajor": 8,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 167936,
    "numSms": 108,
    "sharedMemPerBlockOptin": 166912,
}
PID = 4242


class TraceBuilder:
    def __init__(self, devices=(A100_80GB,), rank: int | None = 0, base_us: int = 1_700_000_000):
        self.devices = [dict(d) for d in devices]
        self.rank = rank
        self.base = base_us
        self.events: list[dict] = []
        self._corr = 100

    def _x(self, cat, name, ts, dur, pid, tid, args=None) -> dict:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid}
        ev["ts"] = self.base + ts
        ev["dur"] = dur
        if args is not None:
            ev["args"] = args
        self.events.append(ev)
        return ev

    def next_corr(self) -> int:
        self._corr += 1
        return self._corr

    def cpu_op(self, name, ts, dur, tid=1, dims=None, types=None):
        args = {"External id": len(self.events)}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = types
        return self._x("cpu_op", name, ts, dur, PID, tid, args)

    def annotation(self, name, ts, dur, tid=1):
        return self._x("user_annotation", name, ts, dur, PID, tid, {})

    def runtime(self, name, ts, dur, corr=None, tid=1):
        args = {"cbid": 211}
        if corr is not None:
            args["correlation"] = corr
        return self._x("cuda_runtime", name, ts, dur, PID, tid, args)

    def gpu(self, cat, name, ts, dur, corr=None, stream=7, device=0, **extra):
        args = {"device": device, "context": 1, "stream": stream}
        if corr is not None:
            args["correlation"] = corr
            args["External id"] = corr
        args.update(extra)
        return self._x(cat, name, ts, dur, device, stream, args)

    def launch(
        self,
        kernel,
        launch_ts,
        launch_dur,
        ts,
        dur,
        stream=7,
        tid=1,
        device=0,
        api="cudaLaunchKernel",
        cat="kernel",
        **extra,
    ) -> int:
        corr = self.next_corr()
        self.runtime(api, launch_ts, launch_dur, corr, tid)
        if cat == "kernel":
            extra = {"registers per thread": 32, "shared memory": 0, **extra}
            extra.setdefault("grid", [64, 1, 1])
            extra.setdefault("block", [128, 1, 1])
        self.gpu(cat, kernel, ts, dur, corr, stream, device, **extra)
        self.events.append(
            {
                "ph": "s",
                "id": corr,
                "pid": PID,
                "tid": tid,
                "ts": self.base + launch_ts,
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        self.events.append(
            {
                "ph": "f",
                "id": corr,
                "pid": device,
                "tid": stream,
                "ts": self.base + ts,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        return corr

    def graph(self, launch_ts, launch_dur, kernels, stream=7, tid=1, device=0) -> int:
        """One graph replay: ``kernels`` is a list of (name, ts, dur)."""
        corr = self.next_corr()
        self.runtime("cudaGraphLaunch", launch_ts, launch_dur, corr, tid)
        for name, ts, dur in kernels:
            self.gpu("kernel", name, ts, dur, corr, stream, device)
        return corr

    def sync(self, kind, ts, dur, tid=1):
        api = {
            "device": "cudaDeviceSynchronize",
            "stream": "cudaStreamSynchronize",
            "event": "cudaEventSynchronize",
        }[kind]
        return self.runtime(api, ts, dur, self.next_corr(), tid)

    def document(self) -> dict:
        doc = {"schemaVersion": 1, "deviceProperties": self.devices}
        if self.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": 2}
        doc["traceEvents"] = self.events
        doc["traceName"] = "synthetic"
        return doc

    def write(self, path, layout: str = "kineto") -> Path:
        """Write as Kineto lays files out (one event per line), or ``compact`` (one line)."""
        path = Path(path)
        doc = self.document()
        if layout == "compact":
            data = orjson.dumps(doc)
        else:
            head = {k: v for k, v in doc.items() if k != "traceEvents"}
            lines = [b"{"]
            for k in ("schemaVersion", "deviceProperties", "distributedInfo"):
                if k in head:
                    lines.append(b'  "' + k.encode() + b'": ' + orjson.dumps(head[k]) + b",")
            lines.append(b'  "traceEvents": [')
            lines.append(b",\n".join(b"  " + orjson.dumps(e) for e in self.events))
            lines.append(b"],")
            lines.append(b'  "traceName": "synthetic"')
            lines.append(b"}")
            data = b"\n".join(lines)
        if path.suffix == ".gz":
            data = gzip.compress(data)
        path.write_bytes(data)
        return path
