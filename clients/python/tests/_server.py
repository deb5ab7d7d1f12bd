"""Starts the lorasink binary the build made for a test, on an ephemeral
port, and stops it; the tests' shared adapter factory."""
import json
import os
import select
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def binary():
    """$LORASINK_BIN, else the default build's binary."""
    path = os.environ.get("LORASINK_BIN", os.path.join(ROOT, "build", "lorasink"))
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{path}: no lorasink binary; build first or set LORASINK_BIN")
    return path


class Server:
    """lorasink --port 0 with args; url once it printed its address."""

    def __init__(self, *args, cwd=None):
        self.log = tempfile.NamedTemporaryFile("w+", prefix="lorasink-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([binary(), "--device", "cpu", "--port", "0", *args], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = self._address(deadline=time.monotonic() + 60)

    def _address(self, deadline):
        """Reads stdout until "listening on http://127.0.0.1:PORT", or the
        process exits, or the deadline passes."""
        line = ""
        while time.monotonic() < deadline:
            ready = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                break
            if line.startswith("listening on "):
                return line.split()[-1]
        self.stop(check=False)
        raise RuntimeError(f"lorasink did not start (last stdout {line!r}); log:\n{self.logtext()}")

    def logtext(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, check=True):
        """SIGTERM; the server must exit 0 (a sanitizer's report at exit
        is a failure), else RuntimeError with its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.logtext() if check and self.proc.returncode != 0 else ""
        self.proc.stdout.close()
        self.log.close()
        os.unlink(self.log.name)
        if text:
            raise RuntimeError(f"lorasink exited {self.proc.returncode} on SIGTERM; log:\n{text[-4000:]}")


def peft_tensors(layers, n, H, F, r, seed, prefix="base_model.model."):
    """Random PEFT factors of the shared experts' fused gate_up_proj and
    down_proj on layers, float32."""
    rng = np.random.default_rng(seed)
    out = {}
    for l in layers:
        p = f"{prefix}model.layers.{l}.mlp.shared_experts."
        out[p + "gate_up_proj.lora_A.weight"] = rng.standard_normal((r, H), dtype=np.float32) * 0.1
        out[p + "gate_up_proj.lora_B.weight"] = rng.standard_normal((n * 2 * F, r), dtype=np.float32) * 0.1
        out[p + "down_proj.lora_A.weight"] = rng.standard_normal((r, n * F), dtype=np.float32) * 0.1
        out[p + "down_proj.lora_B.weight"] = rng.standard_normal((H, r), dtype=np.float32) * 0.1
    return out


def write_peft_dir(path, tensors, config):
    """A PEFT directory as save_pretrained writes one (with the
    safetensors library, so the client's reader is checked against it)."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "target_modules": ["gate_up_proj", "down_proj"], **config}, f)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"), metadata={"format": "pt"})  # as PEFT's
