"""An honest RoPE candidate, written differently from the reference: the rotated pairs as
complex numbers multiplied by cos + i·sin, in float32, written back in place."""

import torch


def _rotate(x, cos, sin, is_neox):
    rot = cos.shape[-1] * 2
    h = x[..., :rot].float()
    if is_neox:
        pairs = torch.stack((h[..., : rot // 2], h[..., rot // 2 :]), dim=-1)
    else:
        pairs = h.unflatten(-1, (rot // 2, 2))
    z = torch.view_as_complex(pairs.contiguous()) * torch.complex(cos, sin)
    r = torch.view_as_real(z)
    r = torch.cat((r[..., 0], r[..., 1]), dim=-1) if is_neox else r.flatten(-2)
    x[..., :rot] = r.to(x.dtype)


def rope_candidate(positions, query, key, cos_sin_cache, is_neox=True, check=True):
    if check and positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise IndexError(f"positions: expected [0, {cos_sin_cache.shape[0]}), got {lo}..{hi}")
    half = cos_sin_cache.shape[1] // 2
    cs = cos_sin_cache[positions.long()].float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    _rotate(query, cos, sin, is_neox)
    _rotate(key, cos, sin, is_neox)
    return query, key
