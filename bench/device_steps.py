"""bench/device_steps: on an accelerator, does the share roofline
attribution gives a request of a batch match what the request costs?

Roofline attribution (metering/attribution.py) gives a decode phase of a
batch of n the share (W / n + K c_i) / (W + K sum c): W the weight bytes
one step reads for the whole batch, K the KV bytes a token of context
holds, c_i the phase's context. That is the claim that a step's time is
proportional to W + K sum c: one term for the weights, one per token of
context, nothing per sequence. This measures it, with PyTorch and
transformers alone (random bf16 weights, no model hub, no vLLM):

1. decode step time against batch size (1 to 256) and context length, the
   KV cache preallocated and written in place (no copy per step), each
   step replayed as a CUDA graph on a GPU (as vLLM runs decode: eager
   PyTorch would spend a batch-1 step launching ~900 kernels from Python);
2. prefill time against prompt length.

Then it fits T = alpha + beta (b c) + gamma b to the decode steps and sets
the fit against roofline's: beta / alpha should be K / W, and gamma (a cost
per sequence roofline has none of) should be small. It writes the tables,
the fit and the verdict as Markdown to --out.

    python bench/device_steps.py --out device_steps.md              # Llama-8B shape, cuda
    python bench/device_steps.py --shape tiny --device cpu --out x  # the test suite's run

On an H200 the whole run took 13-18 s (well inside eight minutes).
Needs torch and transformers only: the project's Django settings are not
read (serving/model_config.py is plain Python)."""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serving.model_config import COMPUTE_PER_TOKEN, roofline_bytes

SHAPES = {
    # Llama 3.1 8B's shape.
    "llama-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
    ),
    # The test suite's: seconds on a CPU.
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=320,
        max_position_embeddings=4096,
    ),
}
GRIDS = {
    "llama-8b": {
        "batches": [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "contexts": [512, 2048, 8192],
        "prompts": [128, 512, 2048, 8192],
    },
    "tiny": {"batches": [1, 2, 4, 8], "contexts": [64, 256], "prompts": [32, 128]},
}


@dataclass
class Decoder:
    """The model's layers run one decode step at a time over a KV cache
    preallocated for `batch` x `context` (+1 for the step's own token),
    written in place: what a serving engine's paged cache costs a step,
    without transformers' cache classes (they copy on append)."""

    model: LlamaForCausalLM
    batch: int
    context: int

    def __post_init__(self) -> None:
        cfg = self.model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // cfg.num_attention_heads
        shape = (self.batch, self.kv_heads, self.context + 1, self.head_dim)
        param = next(self.model.parameters())
        self.keys = [
            torch.randn(shape, dtype=param.dtype, device=param.device) for _ in self.layers
        ]
        self.values = [
            torch.randn(shape, dtype=param.dtype, device=param.device) for _ in self.layers
        ]
        self.tokens = torch.randint(0, cfg.vocab_size, (self.batch, 1), device=param.device)

    @property
    def layers(self):
        return self.model.model.layers

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        hidden = self.model.model.embed_tokens(self.tokens)
        b, position = self.batch, self.context
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = attn.q_proj(x).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            keys[:, :, position : position + 1] = k  # in place, as a paged cache does
            values[:, :, position : position + 1] = v
            out = F.scaled_dot_product_attention(
                q, keys, values, enable_gqa=self.heads != self.kv_heads
            )
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, 1, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.lm_head(self.model.model.norm(hidden))


def graphed(function, device: str):
    """`function` captured once as a CUDA graph and replayed (on a GPU);
    as it is elsewhere."""
    if device != "cuda":
        return function
    try:
        return _capture(function)
    except Exception as error:  # measured eager instead, and said so
        print(f"not captured as a CUDA graph ({error!r}): timed eager", file=sys.stderr)
        torch.cuda.synchronize()
        return function


def _capture(function):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm the kernels' autotuning outside the capture
            function()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        function()
    return graph.replay


def bandwidth(device: str) -> float | None:
    """Bytes a second a device-to-device copy of 2 GiB moves (read plus
    written): what the weights can stream at, at best."""
    if device != "cuda":
        return None
    source = torch.empty(2**30, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    seconds = timed(lambda: target.copy_(source), device=device, repeat=10)
    return 2 * 2**30 / seconds


def timed(function, *, device: str, repeat: int, warmup: int = 2) -> float:
    """Median seconds of `function()` over `repeat` runs."""
    for _ in range(warmup):
        function()
    took = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        function()
        if device == "cuda":
            torch.cuda.synchronize()
        took.append(time.perf_counter() - started)
    return sorted(took)[len(took) // 2]


def kv_budget_tokens(config: LlamaConfig, device: str) -> int:
    """How many tokens of KV cache fit in what the device has left, with room."""
    _, kv_per_token = roofline_bytes(config.to_dict() | {"torch_dtype": "bfloat16"})
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return int(free * 0.7) // kv_per_token
    return 10**6


def fit(points: list[tuple[int, int, float]]) -> tuple[float, float, float]:
    """Least squares of T = alpha + beta (b c) + gamma b over (b, c, T)."""
    rows = torch.tensor([[1.0, b * c, b] for b, c, _ in points], dtype=torch.float64)
    times = torch.tensor([t for _, _, t in points], dtype=torch.float64)
    solution = torch.linalg.lstsq(rows, times.unsqueeze(1)).solution.squeeze(1)
    return tuple(float(x) for x in solution)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-8b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    grid = GRIDS[args.shape]
    config = LlamaConfig(**SHAPES[args.shape])
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: no float32 copy of 8 B weights
    with torch.device(args.device):
        model = LlamaForCausalLM(config).eval()
    weight_bytes, kv_per_token = roofline_bytes(config.to_dict() | {"torch_dtype": "bfloat16"})
    budget = kv_budget_tokens(config, args.device)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    decode: dict[tuple[int, int], float] = {}
    for context in grid["contexts"]:
        for batch in grid["batches"]:
            if batch * (context + 1) > budget:
                continue
            decoder = Decoder(model, batch, context)
            step = graphed(decoder.step, args.device)
            decode[(batch, context)] = timed(step, device=args.device, repeat=args.repeat)
            say(f"decode b={batch} c={context}: {decode[(batch, context)] * 1000:.2f} ms")
            del decoder, step
            if args.device == "cuda":
                torch.cuda.empty_cache()
    prefill: dict[int, float] = {}
    for length in grid["prompts"]:
        ids = torch.randint(0, config.vocab_size, (1, length), device=args.device)

        @torch.inference_mode()
        def forward(ids=ids):
            return model(input_ids=ids, use_cache=False, logits_to_keep=1)

        run = graphed(forward, args.device)
        prefill[length] = timed(run, device=args.device, repeat=max(3, args.repeat // 3))
        say(f"prefill {length}: {prefill[length] * 1000:.2f} ms")
        del run

    copy_rate = bandwidth(args.device)
    alpha, beta, gamma = fit([(b, c, t) for (b, c), t in decode.items()])
    roofline_ratio = kv_per_token / weight_bytes  # beta / alpha, by roofline
    measured_ratio = beta / alpha if alpha > 0 else math.inf
    biggest = max(decode)
    per_sequence_share = gamma * biggest[0] / decode[biggest]
    # A prompt token's compute against the weights: the prefill's slope over
    # its two longest prompts, over alpha (a whole read of the weights).
    (short, t_short), (long, t_long) = sorted(prefill.items())[-2:]
    prompt_token = (t_long - t_short) / (long - short)
    lines = [
        f"# Decode steps and prefill on {device_name(args.device)}",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC}; shape `{args.shape}`; torch "
        f"{torch.__version__}; random bf16 weights; Python {platform.python_version()}; "
        f"the run took {time.perf_counter() - started:.0f} s.",
        "",
        f"Roofline's bytes for this shape (serving/model_config.py): W = "
        f"{weight_bytes / 2**20:,.1f} MiB of weights a step, K = {kv_per_token / 1024:,.1f} KiB "
        "of KV cache a token of context.",
        "",
        *(
            [
                f"A device-to-device copy moved {copy_rate / 1e12:.2f} TB/s (read plus written); "
                f"the fit's fixed cost of a step (alpha, below) streams W at "
                f"{weight_bytes / alpha / 1e12:.2f} TB/s.",
                "",
            ]
            if copy_rate and alpha > 0
            else []
        ),
        "## Decode step, ms (batch across, context down)",
        "",
        "| context | " + " | ".join(str(b) for b in grid["batches"]) + " |",
        "|---|" + "---|" * len(grid["batches"]),
    ]
    for context in grid["contexts"]:
        cells = [
            f"{decode[(b, context)] * 1000:.2f}" if (b, context) in decode else "-"
            for b in grid["batches"]
        ]
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Prefill, one prompt",
        "",
        "| prompt tokens | ms | tokens / s |",
        "|---|---|---|",
        *(f"| {n} | {t * 1000:.2f} | {n / t:,.0f} |" for n, t in prefill.items()),
        "",
        "## Against roofline",
        "",
        f"Fit over every decode step: T = {alpha * 1000:.3f} ms + {beta * 1e9:.3f} ns per token "
        f"of context in the batch + {gamma * 1e6:.2f} µs per sequence.",
        "",
        "| | roofline | measured |",
        "|---|---|---|",
        f"| a token of context against the weights (beta / alpha) | {roofline_ratio:.3e} | "
        f"{measured_ratio:.3e} (x {measured_ratio / roofline_ratio:.2f}) |",
        f"| the per-sequence term's share of the largest step (b={biggest[0]}, "
        f"c={biggest[1]}) | 0 | {per_sequence_share:.1%} |",
        f"| a decoding sequence's compute against the weights (gamma / alpha) | "
        f"{COMPUTE_PER_TOKEN:.2e} | {gamma / alpha:.2e} |",
        f"| a prompt token's compute against the weights (prefill slope {short}-{long} "
        f"tokens / alpha) | {COMPUTE_PER_TOKEN:.2e} | {prompt_token / alpha:.2e} |",
        "",
        verdict(
            measured_ratio / roofline_ratio,
            per_sequence_share,
            (gamma / alpha, prompt_token / alpha),
        ),
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def verdict(ratio: float, per_sequence: float, computes: tuple[float, ...]) -> str:
    """What the fit says about attribution's weights: the context term
    against K, and each compute-per-token reading against COMPUTE_PER_TOKEN."""
    advice = []
    if not 0.5 <= ratio <= 2:
        advice.append(
            f"a token of context costs x {ratio:.2f} what its bytes say against the weights: "
            "scale K (the KV term) by that"
        )
    off = [c for c in computes if not 0.5 <= c / COMPUTE_PER_TOKEN <= 2]
    if off:
        advice.append(
            f"a token's compute reads {', '.join(f'{c:.2e}' for c in off)} of a weight read, "
            f"more than 2x off COMPUTE_PER_TOKEN ({COMPUTE_PER_TOKEN:.2e}): set it from these"
        )
    if not advice:
        return (
            "Verdict: the measured steps keep attribution's shape (the context term within 2x "
            "of its bytes, a token's compute within 2x of COMPUTE_PER_TOKEN; the per-sequence "
            f"term is {per_sequence:.0%} of the largest step): the weights stand."
        )
    return "Verdict: " + "; ".join(advice) + "."


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} (CPU)"


if __name__ == "__main__":
    main()
