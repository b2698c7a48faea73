"""Chunked layer 1 (fused linear logprobs) with vendor GEMMs and a pluggable epilogue.

Rows are processed in chunks of R tokens over the full vocabulary: one GEMM writes the tempered
logits tile z = (h Wᵀ + b) / τ  [R, V] (fp32) into a workspace bounded by `workspace_bytes`,
an epilogue reduces it to per-token statistics, and, for gradients, rewrites it in place into

    dz = gℓ (onehot(y) − p) − gH p (log p + H)          (∂L/∂z, p = softmax(z), H = entropy)

from which two more GEMMs give  dh = dz W / τ  and  dW += dzᵀ h / τ  (db += Σ_rows dz / τ).
Nothing of size N·V exists; extra memory is O(N) + O(R·V).

Soft-capped heads (`softcap` c > 0, Gemma's final_logit_softcapping): the logits are
z = c tanh((h Wᵀ + b) / c) / τ. The GEMM still writes x = (h Wᵀ + b) / τ; the epilogue reads the tile as
z = κ tanh(x / κ) with κ = c / τ (the same function: c tanh(u / c) / τ at u = τ x) and writes
∂L/∂x = dz (1 − tanh²(x / κ)), so the GEMMs after it are unchanged. softcap = 0: no extra work.

Two ways to get gradients:
  * `forward` then `backward` (recompute): 4 GEMMs, used when the upstream per-token gradients
    are only known later (`fused_logprobs` under autograd).
  * `forward_backward`: the caller's `token_grads(rows, logp, entropy)` gives (gℓ, gH) for a chunk
    as soon as its statistics exist, so dz is formed from the tile already in the workspace:
    3 GEMMs. Needs chunks whose gradients depend on their own rows only (see grpo_loss).

The epilogue is the backend-specific part: `TorchEpilogue` here (the oracle), the C++/CUDA one
in grpo_fast.backends.native.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from .base import Capabilities, LogprobStats, TokenGrads


class Epilogue(Protocol):
    """Reduces a tile z [R, V] fp32 (the GEMM output) to statistics and rewrites it into its gradient. With
    softcap κ > 0 (in the tile's units) the tile holds the pre-cap values and the logits are κ tanh(z / κ)."""

    def stats(
        self, z: torch.Tensor, targets: torch.Tensor, softcap: float = 0.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """z [R, V] fp32 (left intact), targets [R] int64 -> (logp, entropy, lse) of the logits, each [R] fp32."""

    def grad_(
        self,
        z: torch.Tensor,
        targets: torch.Tensor,
        lse: torch.Tensor,
        entropy: torch.Tensor,
        grad_logp: torch.Tensor,
        grad_entropy: torch.Tensor | None,
        softcap: float = 0.0,
    ) -> None:
        """Overwrite z [R, V] fp32 with dℓ = gℓ (onehot − p) − gH p (log p + H) (∂L/∂logits, gH None = 0),
        times the cap's slope 1 − tanh²(z / κ) when softcap κ > 0 (then ∂L/∂z)."""


class TorchEpilogue:
    """The epilogue in plain PyTorch ops, fp32 throughout, with one block-shaped temporary (the probabilities; with
    a soft cap also tanh): rows go in blocks whose temporaries stay within a budget whatever the tile size, few ops
    per block, the softmax a row-wise kernel.

    On CPU (`temp_bytes`) every op over a block is an OpenMP parallel region, whose threads wait for each other at
    its end: on a loaded host a descheduled thread stalls the others, so the cost grows with the number of ops, not
    the bytes. Blocks of 16 MiB take ~25 of them per 48 MiB chunk where blocks of 4 MiB and ten ops each took ~250
    (benchmarks/NOTES.md, "The torch backend under load"). On a GPU (`accelerator_temp_bytes`) every op of a block
    is a kernel launch of ~15 µs of host time: 4 MiB blocks were 3 rows of a 152k vocabulary, and the epilogue ran
    launch-bound at 12x the three GEMMs (benchmarks/NOTES.md, "First GPU run")."""

    def __init__(self, temp_bytes: int = 16 << 20, accelerator_temp_bytes: int = 256 << 20):
        self.temp_bytes, self.accelerator_temp_bytes = temp_bytes, accelerator_temp_bytes

    def _blocks(self, z, softcap):
        budget = self.temp_bytes if z.device.type == "cpu" else self.accelerator_temp_bytes
        temporaries = 2 if softcap else 1
        return row_slices(z.shape[0], budget // (temporaries * z.shape[1] * z.element_size()))

    @torch.no_grad()
    def stats(self, z, targets, softcap=0.0):
        out = torch.empty(3, z.shape[0], dtype=z.dtype, device=z.device)
        for rows in self._blocks(z, softcap):  # each block's temporaries are freed before the next one's exist
            self._stats_block(z[rows], targets[rows], softcap, out[:, rows])
        return out[0], out[1], out[2]

    @staticmethod
    def _stats_block(block, targets, softcap, out):
        """out [3, R] = (logp, entropy, lse) of the block [R, V]. softmax is one row-wise kernel (its passes over a
        row stay in cache). lse = m − log p_max: the row's largest probability is at least 1 / V, so its log is
        exact to an ulp (log p_y would underflow). H = −Σ p log p = −Σ xlogy(p, p), formed in place of p: nothing of
        the logits' size cancels (lse − Σ p z lost 1e-5 of H at logits of ±15 in fp32)."""
        if softcap:  # the logits κ tanh(x / κ) of the block x
            block = torch.div(block, softcap).tanh_().mul_(softcap)
        row_max, at_max = block.max(dim=1, keepdim=True)
        p = torch.softmax(block, dim=1)
        out[2] = (row_max - torch.log(p.gather(1, at_max))).view(-1)
        out[1] = -torch.special.xlogy(p, p, out=p).sum(dim=1)
        out[0] = block.gather(1, targets.view(-1, 1)).view(-1) - out[2]

    @torch.no_grad()
    def grad_(self, z, targets, lse, entropy, grad_logp, grad_entropy, softcap=0.0):
        for rows in self._blocks(z, softcap):
            g_entropy = None if grad_entropy is None else grad_entropy[rows].view(-1, 1)
            row = (targets[rows].view(-1, 1), lse[rows].view(-1, 1), entropy[rows].view(-1, 1))
            self._grad_block(z[rows], *row, grad_logp[rows].view(-1, 1), g_entropy, softcap)

    @staticmethod
    def _grad_block(block, targets, lse, entropy, g_logp, g_entropy, softcap):
        """The block [R, V] overwritten with its dz (see `Epilogue.grad_`); per-row inputs [R, 1]."""
        if softcap:  # the block x becomes the logits κ tanh(x / κ); t = tanh(x / κ) is kept for the slope
            tanh = torch.div(block, softcap).tanh_()
            block.copy_(tanh).mul_(softcap)
        if g_entropy is None:  # dz = gℓ (onehot − p), p from the row-wise softmax kernel
            torch.mul(torch.softmax(block, dim=1), -g_logp, out=block)
        else:
            # dz = p (a log p + b) + gℓ onehot with a = −gH, b = −gH H − gℓ; log p = z − lse formed first
            # (a z − a lse cancels: large logits lost all of dz's entropy part in fp32).
            log_p = block.sub_(lse)
            p = log_p.exp()
            a = -g_entropy
            log_p.mul_(a).add_(a * entropy - g_logp).mul_(p)
        block.scatter_add_(1, targets, g_logp)
        if softcap:  # ∂L/∂x = dℓ (1 − t²)
            block.mul_(tanh.square_().neg_().add_(1.0))


def row_slices(num_rows: int, step: int) -> list[slice]:
    """[0, num_rows) in consecutive slices of `step` rows (at least one row each; the last may be shorter)."""
    step = max(1, step)
    return [slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs; fp64 inputs stay fp64 (gradcheck)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _mm_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [K, P] -> [M, P] in the accumulation dtype (fp32 accumulation inside the vendor GEMM)."""
    acc = accumulation_dtype(a.dtype)
    if a.dtype == acc:
        return torch.mm(a, b)
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=acc)
    return torch.mm(a, b).to(acc)


def _gemm_operands(hidden, weight, bias):
    """The operands the GEMMs read. On CPU, bf16 / fp16 ones become fp32 copies (the weight's: one [V, H]
    copy per call, 4·V·H bytes), so that the logits are fp32-exact (not bf16-rounded before the
    epilogue) and every GEMM runs in fp32: ATen has no mixed-precision GEMM on CPU, and on CPUs without
    AVX512-BF16 / AMX its bf16 GEMMs run 10-60x slower than fp32 ones (benchmarks/NOTES.md, "bf16 on
    CPU"). On CUDA they are returned as they are (tensor cores, fp32 output through out_dtype)."""
    if hidden.is_cuda:
        return hidden, weight, bias
    return tuple(None if t is None else t.to(accumulation_dtype(t.dtype)) for t in (hidden, weight, bias))


_FP32_ADDMM_PROBED: dict[torch.device, bool] = {}


def _cuda_addmm_accumulates_in_fp32(device: torch.device) -> bool:
    """Whether `torch.addmm(C, A, B, out_dtype=torch.float32, beta=β, alpha=α, out=C)` with bf16/fp16 A, B and
    an fp32 C is one cuBLAS GEMM on `device` that, with β = 1, adds α·A·B into C (the dW accumulation) and,
    with β = 0, overwrites C with α·A·B without reading it (the logits tile written straight into an
    uninitialised workspace, which may hold NaN).

    torch >= 2.8 has the out_dtype overload, on CUDA only; before pytorch#167931 (torch 2.10) it required
    C in the input dtype, so an fp32 accumulator raised. Probed once per device on exactly representable
    values (the result must be bit-exact), drawing no random numbers (the caller's RNG stream is
    untouched); not probed during CUDA graph capture (the answer is then "no" until probed outside).
    """
    if device not in _FP32_ADDMM_PROBED:
        if torch.cuda.is_current_stream_capturing():
            return False
        _FP32_ADDMM_PROBED[device] = _probe_fp32_addmm(device)
    return _FP32_ADDMM_PROBED[device]


def _probe_fp32_addmm(device: torch.device) -> bool:
    try:
        for dtype in (torch.bfloat16, torch.float16):
            a = (torch.arange(12, device=device, dtype=torch.float32).view(3, 4) - 5).to(dtype)
            b = (torch.arange(6, device=device, dtype=torch.float32).view(3, 2) - 2).to(dtype)
            product = 0.5 * (a.float().t() @ b.float())
            for beta, start in ((1.0, 0.25), (0.0, float("nan"))):
                c = torch.arange(8, device=device, dtype=torch.float32).view(4, 2) + start
                expected = product + c if beta else product
                result = torch.addmm(c, a.t(), b, out_dtype=torch.float32, beta=beta, alpha=0.5, out=c)
                if result.data_ptr() != c.data_ptr() or not torch.equal(c, expected):
                    return False
        return True
    except (RuntimeError, TypeError, NotImplementedError):
        return False


class ChunkedBackend:
    """Layer 1 over row chunks: GEMM -> epilogue -> (GEMM, GEMM); a `Backend` with `ChunkedHooks`
    (grpo_fast.backends.base). It runs on the device types `devices`; GEMMs are deterministic, so it is its own
    deterministic variant."""

    capabilities = Capabilities(fused_gradients=True)

    def __init__(
        self,
        name: str,
        epilogue: Epilogue,
        cpu_workspace_bytes: int,
        gpu_workspace_bytes: int,
        devices: tuple[str, ...] = ("cpu", "cuda"),
    ):
        self.name = name
        self.epilogue = epilogue
        self.cpu_workspace_bytes = cpu_workspace_bytes
        self.gpu_workspace_bytes = gpu_workspace_bytes
        self.devices = devices

    def availability(self, device: torch.device) -> str | None:
        return None if device.type in self.devices else f"runs on {' / '.join(self.devices)} tensors only"

    def deterministic_variant(self) -> ChunkedBackend:
        return self

    def rows_per_chunk(self, vocab: int, device: torch.device, workspace_bytes: int | None) -> int:
        """R such that one fp32 [R, V] tile fits the workspace budget (at least one row)."""
        budget = workspace_bytes or (self.gpu_workspace_bytes if device.type == "cuda" else self.cpu_workspace_bytes)
        return max(1, budget // (4 * vocab))

    def row_chunks(self, num_rows: int, vocab: int, device: torch.device, workspace_bytes: int | None):
        """ceil(N / R) chunks of near-equal size: no short last chunk paying a whole pass over W and dW."""
        most = self.rows_per_chunk(vocab, device, workspace_bytes)
        count = max(1, -(-num_rows // most))
        return row_slices(num_rows, -(-num_rows // count))

    @staticmethod
    def _logits(hidden, weight, bias, inv_temperature, workspace):
        """Tempered logits z = (h Wᵀ + b) / τ of the rows in `hidden` [R, H], written by the GEMM straight
        into workspace [R, V] (no tile-sized temporary, no copy)."""
        if hidden.dtype == workspace.dtype:  # one GEMM call with α = β = 1/τ, no extra pass over the tile
            if bias is None:
                return torch.addmm(workspace, hidden, weight.t(), beta=0.0, alpha=inv_temperature, out=workspace)
            return torch.addmm(bias, hidden, weight.t(), beta=inv_temperature, alpha=inv_temperature, out=workspace)
        # bf16 / fp16 (CUDA: on CPU `_gemm_operands` made them fp32): a cuBLAS GEMM with an fp32 output
        if _cuda_addmm_accumulates_in_fp32(hidden.device):  # α = 1/τ inside the GEMM
            z = torch.addmm(
                workspace, hidden, weight.t(), out_dtype=workspace.dtype, beta=0.0, alpha=inv_temperature, out=workspace
            )
        else:
            z = torch.mm(hidden, weight.t(), out_dtype=workspace.dtype, out=workspace).mul_(inv_temperature)
        return z if bias is None else z.add_(bias, alpha=inv_temperature)

    def forward(
        self, hidden, weight, bias, targets, inv_temperature, workspace_bytes=None, softcap=0.0
    ) -> LogprobStats:
        """hidden [N, H], weight [V, H], bias [V] | None, targets [N] -> LogprobStats ([N] fp32 each).
        softcap: as in `forward_backward`."""
        chunks = self.row_chunks(hidden.shape[0], weight.shape[0], hidden.device, workspace_bytes)
        stats, _ = self.forward_backward(
            hidden, weight, bias, targets, inv_temperature, None, chunks, need_grads=False, softcap=softcap
        )
        return stats

    def backward(
        self,
        hidden,
        weight,
        bias,
        targets,
        inv_temperature,
        stats: LogprobStats,
        grad_logp,
        grad_entropy,
        workspace_bytes=None,
        softcap=0.0,
    ):
        """Recompute each tile and accumulate (dh [N, H] in hidden's dtype, dW [V, H] fp32, db [V] fp32 | None).
        softcap: as in `forward_backward`."""
        hidden_dtype = hidden.dtype
        hidden, weight, bias = _gemm_operands(hidden, weight, bias)
        grads = _GradAccumulator(hidden, weight, bias, inv_temperature)
        chunks = self.row_chunks(hidden.shape[0], weight.shape[0], hidden.device, workspace_bytes)
        workspace = self._workspace(chunks, weight.shape[0], hidden)
        cap = _tile_cap(softcap, inv_temperature)
        for rows in chunks:
            z = self._logits(hidden[rows], weight, bias, inv_temperature, workspace[: rows.stop - rows.start])
            g_h = None if grad_entropy is None else grad_entropy[rows]
            self.epilogue.grad_(z, targets[rows], stats.lse[rows], stats.entropy[rows], grad_logp[rows], g_h, *cap)
            grads.add(rows, z)
        return grads.result(hidden_dtype)

    def forward_backward(
        self,
        hidden,
        weight,
        bias,
        targets,
        inv_temperature,
        token_grads: TokenGrads | None,
        chunks: Iterable[slice],
        need_grads: bool = True,
        softcap: float = 0.0,
    ):
        """One pass with the gradient formed from the tile in the workspace (3 GEMMs per chunk).

        token_grads(rows, logp, entropy) -> (gℓ [R], gH [R] | None) is called once per chunk in order
        (None: statistics only). Returns (LogprobStats, (dh, dW, db) or None when not need_grads).
        softcap: c of z = c tanh((h Wᵀ + b) / c) / τ (0 = off).
        """
        vocab = weight.shape[0]
        hidden_dtype = hidden.dtype
        hidden, weight, bias = _gemm_operands(hidden, weight, bias)
        out = self._stats_buffers(hidden)
        chunks = list(chunks)
        workspace = self._workspace(chunks, vocab, hidden)
        grads = _GradAccumulator(hidden, weight, bias, inv_temperature) if need_grads else None
        cap = _tile_cap(softcap, inv_temperature)
        for rows in chunks:
            z = self._logits(hidden[rows], weight, bias, inv_temperature, workspace[: rows.stop - rows.start])
            logp, entropy, lse = self.epilogue.stats(z, targets[rows], *cap)
            for dst, value in zip(out, (logp, entropy, lse), strict=True):
                dst[rows].copy_(value)
            if token_grads is None:
                continue
            grad_logp, grad_entropy = token_grads(rows, logp, entropy)
            if grads is not None:
                self.epilogue.grad_(z, targets[rows], lse, entropy, grad_logp, grad_entropy, *cap)
                grads.add(rows, z)
        return LogprobStats(*out), (grads.result(hidden_dtype) if grads is not None else None)

    @staticmethod
    def _stats_buffers(hidden):
        """Separate [N] buffers for logp, entropy, lse (outputs of custom ops must not alias)."""
        return [
            torch.empty(hidden.shape[0], dtype=accumulation_dtype(hidden.dtype), device=hidden.device) for _ in range(3)
        ]

    @staticmethod
    def _workspace(chunks, vocab, hidden):
        longest = max((c.stop - c.start for c in chunks), default=0)
        return torch.empty(longest, vocab, dtype=accumulation_dtype(hidden.dtype), device=hidden.device)


def _tile_cap(softcap: float, inv_temperature: float) -> tuple[float, ...]:
    """The epilogue's softcap argument: (κ,) with κ = c / τ, the cap in the tile's tempered units; () when off,
    so that an epilogue without the argument keeps working for heads without a cap."""
    return (softcap * inv_temperature,) if softcap else ()


class _GradAccumulator:
    """dh rows written per chunk; dW and db accumulated across chunks in the accumulation dtype.

    Low-precision (bf16 / fp16) weights keep dW in fp32, accumulated by one GEMM per chunk straight
    into it (no fp32 temporary written and read again):
      * CUDA: `torch.addmm(dW, dzᵀ, h, out_dtype=fp32, out=dW)`, a cuBLAS GEMM with bf16 A/B and fp32 C,
        β = 1 (torch >= 2.10; older torch falls back to vocabulary slices, see `_cuda_addmm_accumulates_in_fp32`);
      * CPU: `dW.addmm_(dzᵀ, h.float())` from the fp32 dz tile still in the workspace and an fp32 copy of
        the chunk's h ([R, H], small): an fp32 GEMM (ATen has no mixed-dtype GEMM on CPU), measured 5-8x
        faster than the bf16 GEMMs + conversions + adds it replaces on an AVX2 CPU, and fp32-exact since it
        uses dz before its bf16 rounding (benchmarks/NOTES.md, "dW accumulation").
    """

    def __init__(self, hidden, weight, bias, inv_temperature):
        self.hidden, self.weight, self.inv_temperature = hidden, weight, inv_temperature
        acc = accumulation_dtype(weight.dtype)
        self.full_precision = weight.dtype == acc
        self.grad_hidden = torch.empty_like(hidden)
        self.grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        self.grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=acc, device=bias.device)
        if self.full_precision:
            self.weight_mode = "addmm"
        elif not weight.is_cuda:
            self.weight_mode = "fp32_addmm"
        elif _cuda_addmm_accumulates_in_fp32(weight.device):
            self.weight_mode = "out_dtype_addmm"
        else:  # older torch on CUDA: vocabulary slices keep the fp32 temporary small
            self.weight_mode = "slices"
        self.vocab_slice = max(1, (1 << 20) // weight.shape[1])

    def add(self, rows: slice, dz: torch.Tensor) -> None:
        """dz [R, V] (accumulation dtype) = ∂L/∂z for `rows`; z = (h Wᵀ + b) τ⁻¹, so every product carries τ⁻¹."""
        h = self.hidden[rows]
        dz_in = dz if self.full_precision else dz.to(self.weight.dtype)
        torch.mm(dz_in, self.weight, out=self.grad_hidden[rows]).mul_(self.inv_temperature)
        grad_weight, alpha = self.grad_weight, self.inv_temperature
        if self.weight_mode == "addmm":
            grad_weight.addmm_(dz_in.t(), h, alpha=alpha)
        elif self.weight_mode == "fp32_addmm":
            grad_weight.addmm_(dz.t(), h.to(grad_weight.dtype), alpha=alpha)
        elif self.weight_mode == "out_dtype_addmm":
            torch.addmm(grad_weight, dz_in.t(), h, out_dtype=grad_weight.dtype, alpha=alpha, out=grad_weight)
        else:
            for start in range(0, dz_in.shape[1], self.vocab_slice):
                cols = slice(start, start + self.vocab_slice)
                grad_weight[cols].add_(_mm_acc(dz_in[:, cols].t(), h), alpha=alpha)
        if self.grad_bias is not None:
            self.grad_bias.add_(dz.sum(dim=0), alpha=self.inv_temperature)

    def result(self, hidden_dtype: torch.dtype):
        """(dh [N, H] in `hidden_dtype`, the caller's, dW [V, H] and db [V] | None in the accumulation dtype)."""
        return self.grad_hidden.to(hidden_dtype), self.grad_weight, self.grad_bias


TORCH_BACKEND = ChunkedBackend("torch", TorchEpilogue(), cpu_workspace_bytes=48 << 20, gpu_workspace_bytes=512 << 20)
"""The PyTorch oracle: runs on any device."""
