"""Preemption: on SIGTERM, finish the step in hand, save the state, exit; run again to go on.

Schedulers stop a job with SIGTERM and, after a grace period, SIGKILL (Kubernetes: 30 s by
default; SLURM: ``--signal``, then ``KillWait``; spot instances: a two-minute notice). This script
trains a tiny model on shards and, on SIGTERM, saves the model, the optimizer and the loader's
position in one file (written whole: a temporary file beside it, then renamed) and exits with
status 0. Started again with the same state file, it continues exactly where it stopped: the
same batches, in the same order, as a run that was never stopped::

    python docs/recipes/preemption.py SHARDS state.pt --epochs 2 --log keys.txt

``--log`` appends the sample keys of every batch trained on (one line per batch), so that a run
can be compared with an uninterrupted one; ``--step-seconds`` makes each step last that long.
"""
# run: python {recipe} data state.pt --epochs 2

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time

import torch

import dalistream


def save_whole(state: dict, path: str) -> None:
    """``torch.save`` into a temporary file beside ``path``, then rename it: the state file is
    the old one or the whole new one, never a cut one (a SIGKILL may come while saving)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".state-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a folder of shards with a manifest (dalistream write's output)")
    parser.add_argument("state", help="the state file: read if it exists, written on SIGTERM")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--log", default=None, help="append each batch's sample keys to this file")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)

    stop = []  # set by SIGTERM: the loop finishes the step in hand, then saves and exits
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stream = dalistream.Stream.open(args.shards, fields={"key": "__key__", "label": "cls"},
                                    batch_size=args.batch_size, workers=2, device="cpu", seed=7)
    with dalistream.Loader(stream) as loader:
        if os.path.exists(args.state):
            saved = torch.load(args.state)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            loader.load_state_dict(saved["loader"])  # the epoch and step it stood at
            print(f"resumed at epoch {loader.epoch} step {loader.step}", flush=True)
        log = open(args.log, "a") if args.log else None
        try:
            for epoch in range(loader.epoch, args.epochs):
                loader.set_epoch(epoch)  # the epoch a loaded state stands in goes on where it stood
                try:
                    for batch in loader:
                        labels = batch["label"].float().reshape(-1, 1)
                        loss = torch.nn.functional.mse_loss(model(labels), labels * 2 + 1)
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                        if log:
                            log.write(" ".join(batch["key"]) + "\n")
                            log.flush()
                        print(f"epoch {epoch} step {loader.step}", flush=True)
                        time.sleep(args.step_seconds)
                        if stop:
                            break
                except dalistream.WorkerError:
                    # SIGTERM sent to the whole process group (SLURM's scancel) stops the DALI
                    # workers too; the loader's position is still that of the last batch trained on
                    if not stop:
                        raise
                if stop:
                    if loader.step >= stream.steps(loader.epoch, loader.resume):  # stopped after an epoch's last
                        loader.set_epoch(loader.epoch + 1)  # batch: the state is the next epoch's start
                    save_whole({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "loader": loader.state_dict()}, args.state)
                    print(f"SIGTERM: state saved at epoch {loader.epoch} step {loader.step}", flush=True)
                    return 0
        finally:
            if log:
                log.close()
    print("weights", *(f"{v:.17g}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
