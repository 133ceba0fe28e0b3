#!/usr/bin/env python3
"""CPU tests of the integration tests' own logic: the parity judge on synthetic curves and results,
and (when DeepSpeed is importable) that DeepSpeed accepts the ZeRO configurations."""
import importlib.util
import math
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import parity  # noqa: E402


def run(curve, eval_loss, sha="a" * 64, fp8_calls=0, nproc=2, loaded=True):
    totals = {"fp8_calls": fp8_calls, "calls": {"passthrough": 3, "two_shot": fp8_calls}} if loaded else None
    return [{"rank": r, "losses": list(curve), "eval_loss": eval_loss, "param_sha256": sha, "totals": totals}
            for r in range(nproc)]


def failed(checks):
    return [label for label, ok, _ in checks if not ok]


CURVE = [1.0 / (1 + 0.1 * i) + 0.01 * math.sin(i) for i in range(120)]


class Judge(unittest.TestCase):
    def test_pearson(self):
        self.assertAlmostEqual(parity.pearson([1, 2, 3], [2, 4, 6]), 1.0)
        self.assertAlmostEqual(parity.pearson([1, 2, 3], [3, 2, 1]), -1.0)
        self.assertTrue(math.isnan(parity.pearson([1, 1, 1], [1, 2, 3])))
        with self.assertRaises(ValueError):
            parity.pearson([1, 2], [1, 2, 3])

    def test_matching_runs_pass(self):
        fp8 = [x * (1 + 0.003 * math.cos(i)) for i, x in enumerate(CURVE)]
        checks, s = parity.evaluate("s", run(CURVE, 0.1, loaded=False), run(fp8, 0.101, fp8_calls=240), 2)
        self.assertEqual(failed(checks), [])
        self.assertTrue(s["ok"])
        self.assertEqual((s["steps"], s["fp8_calls"]), (120, 240))
        self.assertGreater(s["pearson"], 0.999)
        self.assertAlmostEqual(s["final_gap"], 0.01)
        self.assertIn("PASS", parity.format_row(s))

    def test_each_failure_is_caught(self):
        plain = run(CURVE, 0.1, loaded=False)
        noisy = [x + (0.05 if i % 2 else -0.05) for i, x in enumerate(CURVE)]
        self.assertIn("loss curves Pearson >= 0.999", failed(parity.evaluate("s", plain, run(noisy, 0.1, fp8_calls=1), 2)[0]))
        self.assertIn("final loss within 2%", failed(parity.evaluate("s", plain, run(CURVE, 0.103, fp8_calls=1), 2)[0]))
        split = run(CURVE, 0.1, fp8_calls=1)
        split[1]["param_sha256"] = "b" * 64
        self.assertIn("fp8wire: every rank ends with the same full parameters", failed(parity.evaluate("s", plain, split, 2)[0]))
        self.assertIn("FP8 calls were made on every rank", failed(parity.evaluate("s", plain, run(CURVE, 0.1), 2)[0]))
        self.assertEqual(failed(parity.evaluate("s", plain, run(CURVE, 0.1), 2, "reported")[0]), [])
        nan = run(CURVE[:-1] + [float("nan")], 0.1, fp8_calls=1)
        self.assertIn("losses finite", failed(parity.evaluate("s", plain, nan, 2)[0]))
        flat = run([0.5] * 120, 0.5, loaded=False)
        self.assertIn("the model learns (plain run)", failed(parity.evaluate("s", flat, run([0.5] * 120, 0.5, fp8_calls=1), 2)[0]))
        checks, s = parity.evaluate("s", plain, run(CURVE, 0.1, fp8_calls=1, nproc=1), 2)
        self.assertFalse(s["ok"])
        self.assertIn("FAIL", parity.format_row(s))

    def test_fp8_calls_is_the_minimum_over_ranks(self):
        res = run(CURVE, 0.1, fp8_calls=5)
        res[1]["totals"] = dict(res[1]["totals"], fp8_calls=0)
        self.assertEqual(parity.fp8_calls(res), 0)


@unittest.skipIf(importlib.util.find_spec("deepspeed") is None, "deepspeed not installed")
class DeepSpeedConfigs(unittest.TestCase):
    def test_zero_configs_parse(self):
        from deepspeed.runtime.config import DeepSpeedConfig

        import test_deepspeed

        for stage in (1, 2, 3):
            cfg = DeepSpeedConfig(test_deepspeed.ds_config(stage, 128))
            self.assertEqual(cfg.zero_optimization_stage, stage)
            self.assertTrue(cfg.zero_config.overlap_comm)
            self.assertTrue(cfg.bfloat16_config.enabled)


@unittest.skipUnless(importlib.util.find_spec("torch"), "torch is not importable")
class AllToAllJudge(unittest.TestCase):
    """tests/sched/all_to_all_torch.py's comparison of an FP8 all-to-all with NCCL's own."""

    def setUp(self):
        import torch

        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "sched"))
        import all_to_all_torch

        self.torch, self.judge = torch, all_to_all_torch.compare
        gen = torch.Generator().manual_seed(3)
        self.n, self.world, self.rank = 300, 3, 1
        self.plain = {"bfloat16/300": torch.randn(self.n * self.world, generator=gen).to(torch.bfloat16),
                      "int32/4099": torch.arange(10, dtype=torch.int32)}

    def outputs(self, scale, own=0.0, ints_off=0):
        fp8 = {}
        for key, want in self.plain.items():
            got = want.clone()
            if key.startswith("int32"):
                got[0] += ints_off
            else:
                w = want.double()
                # Every element moved by `scale` of its 128-block's amax (blocks of each chunk's own).
                for j in range(self.world):
                    chunk = w[j * self.n:(j + 1) * self.n]
                    pad = self.torch.nn.functional.pad(chunk.abs(), (0, (-self.n) % 128))
                    amax = pad.view(-1, 128).amax(dim=1).repeat_interleave(128)[:self.n]
                    step = own if j == self.rank else scale
                    chunk += step * amax
                got = w.to(want.dtype)
            fp8[key] = got
        return fp8

    def test_within_one_quantization_passes(self):
        worst, failures = self.judge(self.plain, self.outputs(1 / 40), self.rank, self.world)
        self.assertEqual(failures, [])
        self.assertLess(worst, 1.0)

    def test_beyond_the_bound_fails(self):
        _, failures = self.judge(self.plain, self.outputs(1 / 10), self.rank, self.world)
        self.assertTrue(any("err/bound" in f for f in failures), failures)

    def test_own_chunk_must_be_exact(self):
        _, failures = self.judge(self.plain, self.outputs(0, own=1 / 100), self.rank, self.world)
        self.assertTrue(any("own chunk" in f for f in failures), failures)

    def test_int32_must_be_exact(self):
        _, failures = self.judge(self.plain, self.outputs(0, ints_off=1), self.rank, self.world)
        self.assertTrue(any("int32" in f for f in failures), failures)


if __name__ == "__main__":
    unittest.main(verbosity=2)
