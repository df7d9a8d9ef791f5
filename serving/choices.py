"""Enumerations of the fleet and the gateway."""

from django.db import models

from tenants.choices import Tier

# A pool is sold as one of the three service tiers a tenant can be on.
PoolKind = Tier


class IdleCostPolicy(models.TextChoices):
    """Who carries a shared pool's idle GPU time."""

    SPREAD = "spread", "Spread pro rata over the pool's tenants"
    PLATFORM = "platform", "Kept as platform idle cost"


class GpuSharing(models.TextChoices):
    """How a replica holds a GPU (serving.gpu_shares)."""

    WHOLE = "whole", "Whole GPU"
    MIG = "mig", "MIG instance"
    TIME_SLICED = "time_sliced", "Time-sliced share"


class Engine(models.TextChoices):
    """The inference server a replica runs: the gateway speaks OpenAI's API
    to each and reads usage and per-request timing the way that engine
    documents them (serving.engines)."""

    VLLM = "vllm", "vLLM"
    TRTLLM = "trtllm", "TensorRT-LLM (trtllm-serve)"
    NIM = "nim", "NVIDIA NIM"
    SGLANG = "sglang", "SGLang"
    TGI = "tgi", "Hugging Face TGI"
    TRITON = "triton", "Triton (OpenAI frontend)"
    DYNAMO = "dynamo", "NVIDIA Dynamo"
    OPENAI = "openai", "Other OpenAI-compatible server"


class ModelTask(models.TextChoices):
    """What a served model does, as its replicas run it (vLLM's runner):
    which OpenAI endpoints can serve it (gateway.payload.KIND_TASKS)."""

    GENERATE = "generate", "Generates text (chat, completions, responses)"
    EMBED = "embed", "Embeds text (embeddings)"


class Concurrency(models.TextChoices):
    """How many requests the gateway lets a replica run at once."""

    ADAPTIVE = "adaptive", "Adaptive: found from its step time, up to max_inflight"
    FIXED = "fixed", "Fixed: max_inflight"


class ReplicaRole(models.TextChoices):
    """What a replica does with a request. In a disaggregated pool one
    replica computes the prompt (prefill) and hands its KV cache to another
    that generates (decode)."""

    BOTH = "both", "Prefill and decode"
    PREFILL = "prefill", "Prefill only (disaggregated)"
    DECODE = "decode", "Decode only (disaggregated)"


class ReplicaStatus(models.TextChoices):
    UP = "up", "Up"
    DOWN = "down", "Down"
    DRAINING = "draining", "Draining (no new requests)"


class RequestStatus(models.TextChoices):
    OK = "ok", "Completed"
    ABORTED = "aborted", "Client went away"
    ERROR = "error", "Failed"
    REJECTED = "rejected", "Refused at admission"


class IntensityPeriod(models.TextChoices):
    """What a grid intensity figure covers."""

    HOUR = "hour", "One hour"
    YEAR = "year", "A year's average"
