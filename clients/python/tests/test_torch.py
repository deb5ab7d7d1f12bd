"""lorasink.torch and the client's torch path, against real transformers
and peft (the pinned venv of scripts/check-hf.sh).

Tiny random-init DeepSeek-V3 and Qwen2-MoE models (four layers, one dense)
are saved with save_pretrained and served by lorasink as saved (--weights
DIR); PEFT adapters on their shared experts are saved with save_pretrained
and loaded into the server from those directories. A copy of each model
whose shared experts are replaced by RemoteSharedExperts must give the
logits of the model with the adapter applied locally by PEFT: relative L2
error at most TOL over the logits of a batch (fp32 throughout; measured
about 1e-6). Controls show the check can fail: the adapter's own effect,
and Qwen's gate applied twice, are each far above TOL.

    LORASINK_BIN=build/lorasink PYTHONPATH=clients/python/src \\
        ~/.cache/lorasink/venv-hf/bin/python -m unittest discover -s clients/python/tests -p test_torch.py
"""
import copy
import os
import shutil
import sys
import tempfile
import unittest
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
import transformers  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402

from lorasink import Client, _tensors  # noqa: E402
from lorasink.torch import GateAppliedRemotely, RemoteSharedExperts, replace_shared_experts, set_adapter  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _server import Server, peft_tensors  # noqa: E402

TOL = 1e-5
LAYERS = 4
PROJS = ("gate_proj", "up_proj", "down_proj")


def rel(got, want):
    return (torch.linalg.norm(got - want) / torch.linalg.norm(want)).item()


def deepseek(hidden_size=32):
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=hidden_size, intermediate_size=48, moe_intermediate_size=16,
        num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2, n_shared_experts=2,
        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1))


def qwen(mlp_only_layers=(1,)):
    return transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
        shared_expert_intermediate_size=24, num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=list(mlp_only_layers)))


def lora_config(family, r, alpha, **extra):
    """LoRA on the shared experts only. DeepSeek-V3's are reachable by
    target_parameters alone in transformers 5 (docs/adapters.md); Qwen's
    by a regex over module names, as the plain names gate_proj, up_proj
    and down_proj also match the dense layer's MLP, which the server does
    not serve (it would list those factors in `ignored`)."""
    if family == "deepseek_v3":
        targets = {"target_modules": None, "target_parameters": [f"mlp.shared_experts.{p}.weight" for p in PROJS]}
    else:
        targets = {"target_modules": r".*\.shared_expert\.(gate_proj|up_proj|down_proj)"}
    return LoraConfig(r=r, lora_alpha=alpha, init_lora_weights=False, **targets, **extra)


class Family:
    """One family: the model, its checkpoint served by lorasink, two
    adapters (one with rsLoRA), each loaded by path and the other from
    its local directory, and a PeftModel per adapter."""

    def __init__(self, family, model, work):
        torch.manual_seed(3)
        self.family, self.model = family, model.eval()
        self.dir = os.path.join(work, family)
        model.save_pretrained(os.path.join(self.dir, "checkpoint"))
        self.local = {}
        for i, (name, cfg) in enumerate((("a", lora_config(family, 4, 8)),
                                         ("b", lora_config(family, 3, 6, use_rslora=True)))):
            torch.manual_seed(10 + i)
            pm = get_peft_model(copy.deepcopy(model), cfg)
            pm.save_pretrained(os.path.join(self.dir, name))
            self.local[name] = PeftModel.from_pretrained(copy.deepcopy(model), os.path.join(self.dir, name)).eval()
        self.server = Server("--weights", os.path.join(self.dir, "checkpoint"), "--max-rank", "8", "--adapter-dir",
                             self.dir)
        self.client = Client(self.server.url)
        self.loaded = [self.client.load("a", path="a"), self.client.load("b", peft_dir=os.path.join(self.dir, "b"))]

    def remote(self, adapter):
        m = copy.deepcopy(self.model)
        self.layers = replace_shared_experts(m, self.client, adapter)
        return m

    def close(self):
        self.client.close()
        self.server.stop()


class TestDropIn(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_default_dtype(torch.float32)
        cls.work = tempfile.mkdtemp(prefix="lorasink-torch-")
        torch.manual_seed(1)
        cls.fams = [Family("deepseek_v3", deepseek(), cls.work), Family("qwen2_moe", qwen(), cls.work)]

    @classmethod
    def tearDownClass(cls):
        for f in cls.fams:
            f.close()
        shutil.rmtree(cls.work)

    def test_loaded_whole(self):
        """The adapters carry the shared experts only, so the server
        applies everything PEFT applies locally."""
        for f in self.fams:
            for r in f.loaded:
                self.assertEqual(r["ignored"], [], f"{f.family}/{r['name']}")

    def test_logits_match_peft(self):
        ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
        for f in self.fams:
            for name in ("a", "b", None):
                with self.subTest(family=f.family, adapter=name), torch.no_grad():
                    want = (f.local[name] if name else f.model)(ids).logits
                    got = f.remote(name)(ids).logits
                    err = rel(got, want)
                    print(f"{f.family} adapter {name}: logits relative L2 {err:.2e} (layers {f.layers})")
                    self.assertLess(err, TOL)
                    if name:  # the control: the adapter's effect is far above TOL
                        self.assertGreater(rel(f.model(ids).logits, want), 1000 * TOL)

    def test_one_adapter_per_sequence(self):
        """One batch, sequence 0 on adapter a and sequence 1 on b: each
        sequence's logits are those of its PeftModel alone."""
        ids = torch.randint(0, 64, (2, 6), generator=torch.Generator().manual_seed(6))
        for f in self.fams:
            with self.subTest(family=f.family), torch.no_grad():
                m = f.remote(["a", "b"])
                got = m(ids).logits
                for row, name in enumerate(("a", "b")):
                    self.assertLess(rel(got[row], f.local[name](ids[row:row + 1]).logits[0]), TOL)

    def test_generate(self):
        """Greedy decoding with the KV cache (one token a step): the same
        tokens and step logits as PEFT's model."""
        ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(7))
        kw = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True,
                  pad_token_id=0, eos_token_id=None)
        for f in self.fams:
            with self.subTest(family=f.family), torch.no_grad():
                want = f.local["a"].generate(input_ids=ids, **kw)
                got = f.remote("a").generate(input_ids=ids, **kw)
                self.assertTrue(torch.equal(got.sequences, want.sequences))
                self.assertLess(rel(torch.stack(got.logits), torch.stack(want.logits)), TOL)

    def test_qwen_gate_once(self):
        """Qwen's gate is applied by the server, once: kept local as well
        it would be applied twice, far from PEFT's logits."""
        f = self.fams[1]
        ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(8))
        m = f.remote("a")
        mlp = m.model.layers[0].mlp
        self.assertIsInstance(mlp.shared_expert, RemoteSharedExperts)
        self.assertIsInstance(mlp.shared_expert_gate, GateAppliedRemotely)
        twice = copy.deepcopy(f.model)
        for l in f.layers:
            twice.model.layers[l].mlp.shared_expert = RemoteSharedExperts(f.client, l, "a", gated=True)
        with torch.no_grad():
            want = f.local["a"](ids).logits
            self.assertLess(rel(m(ids).logits, want), TOL)
            self.assertGreater(rel(twice(ids).logits, want), 1000 * TOL)

    def test_refuses_another_model(self):
        """A model the server does not serve is refused before anything
        is replaced: a layer it does not serve, or a gate on one side."""
        ds = self.fams[0]
        for model, why in ((qwen(), "layer 0"), (qwen(mlp_only_layers=(0,)), "gate")):
            with self.subTest(why=why):
                with self.assertRaisesRegex(ValueError, why):
                    replace_shared_experts(model, ds.client, "a")
                self.assertFalse(any(isinstance(m, RemoteSharedExperts) for m in model.modules()))
        with self.assertRaisesRegex(ValueError, "hidden size"):
            replace_shared_experts(deepseek(hidden_size=48), ds.client)

    def test_module_dtypes_and_runs(self):
        f = self.fams[0]
        mod = RemoteSharedExperts(f.client, 1, ["a", None])
        x = torch.randn(2, 3, 32, dtype=torch.bfloat16)
        y = mod(x)
        self.assertEqual((y.dtype, y.shape), (torch.bfloat16, x.shape))
        full = f.client.forward(1, x.reshape(6, 32), adapters=["a"] * 3 + [None] * 3)
        self.assertTrue(torch.equal(y, full.to(torch.bfloat16).reshape(x.shape)))
        set_adapter(torch.nn.Sequential(mod), ["a", "b", None, "a"])
        with self.assertRaisesRegex(ValueError, "equal runs"):
            mod(x)


class TestTorchTensors(unittest.TestCase):
    """The client's torch path on the demo model (n=2, H=64, F=32)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--demo", "--hidden", "64", "--intermediate", "32", "--slots", "4", "--max-rank", "8")
        cls.c = Client(cls.server.url)
        cls.t = peft_tensors([0, 1], 2, 64, 32, 4, seed=1)
        cls.c.load("a1", tensors=cls.t, config={"r": 4, "lora_alpha": 8})

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.server.stop()

    def test_forward_dtypes(self):
        """torch in, torch out: float32 on x's device, the values of the
        numpy path for the same numbers (bf16 and f16 sent as such)."""
        x = torch.randn(5, 64)
        for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            with self.subTest(dtype=dtype):
                xt = x.to(dtype)
                y = self.c.forward(1, xt, adapters="a1")
                self.assertEqual((y.dtype, y.device, tuple(y.shape)), (torch.float32, xt.device, (5, 64)))
                want = self.c.forward(1, xt.to(torch.float32).numpy(), adapters="a1")
                np.testing.assert_array_equal(y.numpy(), want)
        g = torch.rand(5, 2, dtype=torch.bfloat16)
        np.testing.assert_array_equal(self.c.forward(0, x, gammas=g).numpy(),
                                      self.c.forward(0, x.numpy(), gammas=g.float().numpy()))

    def test_forward_odd_tensors(self):
        x = torch.randn(64, 4, requires_grad=True)
        want = self.c.forward(0, x.detach().T.contiguous().numpy(), adapters=["a1", None, "a1", None])
        got = self.c.forward(0, x.T, adapters=["a1", None, "a1", None])  # a transposed view, needing grad
        np.testing.assert_array_equal(got.numpy(), want)

    def test_forward_subclass_and_lazy_views(self):
        """A torch.Tensor subclass went through numpy (y came back numpy,
        or raised for requires_grad), and a negated view raised."""
        class Tagged(torch.Tensor):
            pass

        x = torch.randn(3, 64)
        want = self.c.forward(0, x.numpy(), adapters="a1")
        for v in (x.clone().as_subclass(Tagged).requires_grad_(), torch._neg_view(-x)):
            with self.subTest(kind=type(v).__name__):
                got = self.c.forward(0, v, adapters="a1")
                self.assertIsInstance(got, torch.Tensor)
                np.testing.assert_array_equal(got.numpy(), want)

    def test_load_bf16_tensors(self):
        """torch bf16 factors travel as bf16: the adapter of float32
        factors holding the same values."""
        bf = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in self.t.items()}
        self.assertEqual({_tensors.to_wire(v, k).dtype for k, v in bf.items()}, {"BF16"})
        f32 = {k: v.float().numpy() for k, v in bf.items()}
        cfg = {"r": 4, "lora_alpha": 8}
        a = self.c.validate(tensors=bf, config=cfg)
        self.assertEqual(a["sha256"], self.c.validate(tensors=f32, config=cfg)["sha256"])
        self.assertNotEqual(a["sha256"], self.c.adapter("a1")["sha256"])


if __name__ == "__main__":
    unittest.main()
