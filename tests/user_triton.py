"""A user's candidate written as vLLM writes it: a plain ``@triton.jit`` fused residual add +
RMSNorm (the residual added in the inputs' dtype, bf16 for bf16) and its launcher, as source for
a file in a test's tmp_path (kernelab verify and bench run it on the CPU with no flag)."""

FUSED_ADD_RMSNORM = """
import torch
import triton
import triton.language as tl


@triton.jit
def fused_add_rmsnorm_kernel(
    out_ptr, out_stride, x_ptr, x_stride, r_ptr, r_stride, w_ptr, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    h = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        h = h + tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0)  # in bf16 for bf16
        tl.store(r_ptr + row * r_stride + cols, h, mask=mask)
    hf = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(hf * hf, axis=0) / MEAN_OVER + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = (hf * rstd * w).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * out_stride + cols, y, mask=mask)


def fused_add_rmsnorm(x, weight, eps=1e-6, residual=None, out=None):
    n_rows, n_cols = x.shape
    out = torch.empty_like(x) if out is None else out
    if n_rows == 0:
        return out
    r = x if residual is None else residual
    fused_add_rmsnorm_kernel[(n_rows,)](
        out, out.stride(0), x, x.stride(0), r, r.stride(0), weight, n_cols, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n_cols),
    )
    return out
"""


def write_candidate(tmp_path, bug: bool = False):
    """The candidate as ``tmp_path/fused.py`` (``bug``: the mean square over n - 1 columns)."""
    path = tmp_path / ("fused_bug.py" if bug else "fused.py")
    path.write_text(FUSED_ADD_RMSNORM.replace("MEAN_OVER", "(n_cols - 1)" if bug else "n_cols"))
    return path
