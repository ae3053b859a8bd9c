"""Planted wrong answers for ``solutions/ex04_online_softmax.py`` (``python -m paged course mutants``)."""

_KERNEL_HEAD = """
    num_blocks = tl.cdiv(context_len, BLOCK_SIZE)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, num_blocks)
    for b in range(first, last):
        physical = tl.load(BT + seq * stride_bt_seq + b).to(tl.int64)
        t_mask = b * BLOCK_SIZE + offs_t < context_len
        kv_mask = t_mask[:, None] & d_mask[None, :]
        kv_offsets = (physical * stride_k_block + offs_t[:, None] * stride_k_tok + kv_head * stride_k_head
                      + offs_d[None, :])
        k = tl.load(K + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)
        s = tl.where(t_mask[None, :], s, float("-inf"))
"""
_KERNEL_UPDATE = """
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
"""


def _swap(code: str, old: str, new: str) -> str:
    """``code`` with one snippet replaced (the snippet must be there: a stale mutant fails loudly)."""
    assert old in code, old
    return code.replace(old, new)


_KERNEL = _KERNEL_HEAD.strip("\n") + "\n" + _KERNEL_UPDATE.strip("\n")

MUTANTS = {
    "ch04.ex1": {
        "no max subtraction (exp of raw scores overflows)": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            p = torch.exp(scores)
            return m_new, l + p.sum(dim=-1), acc + p @ values
        """,
        "no guard for a row still at -inf (exp(-inf - -inf) is NaN)": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[:, None])
            return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values
        """,
        "acc never rescaled when the max grows": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[:, None])
            return m_new, l * alpha + p.sum(dim=-1), acc + p @ values
        """,
        "rescale factor inverted (exp(m_new - m))": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.where(torch.isfinite(m), torch.exp(m_safe - m), torch.zeros_like(m))
            p = torch.exp(scores - m_safe[:, None])
            return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values
        """,
        "keeps the old max (m never updated)": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[:, None])
            return m, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values
        """,
    },
    "ch04.ex2": {
        "the last block's tail is not masked in the scores": _swap(
            _KERNEL, '        s = tl.where(t_mask[None, :], s, float("-inf"))\n', ""
        ),
        "acc not rescaled by alpha": _swap(_KERNEL, "acc = acc * alpha[:, None] +", "acc = acc +"),
        "l not rescaled by alpha": _swap(_KERNEL, "l = l * alpha +", "l = l +"),
        "logical block used as the physical block (no table lookup)": _swap(
            _KERNEL,
            "physical = tl.load(BT + seq * stride_bt_seq + b).to(tl.int64)",
            "physical = b.to(tl.int64)",
        ),
        "split range not clamped to the context (empty splits give NaN)": _swap(
            _KERNEL,
            "last = tl.minimum(first + blocks_per_split, num_blocks)",
            "last = first + blocks_per_split",
        ),
        "every split starts at block 0": _swap(
            _KERNEL, "first = split * blocks_per_split", "first = split * 0"
        ),
        "token mask one slot too long (<= context_len)": _swap(
            _KERNEL, "offs_t < context_len", "offs_t <= context_len"
        ),
        "values loaded without the token mask (0 x NaN from the tail)": _swap(
            _KERNEL,
            "v = tl.load(V + kv_offsets, mask=kv_mask, other=0.0)",
            "v = tl.load(V + kv_offsets, mask=d_mask[None, :], other=0.0)",
        ),
    },
    "ch04.ex4": {
        "no shift by the largest lse (exp overflows)": """
            w = torch.exp(lse)
            total = w.sum(dim=-1)
            summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
            return summed / torch.where(total > 0, total, 1.0)[..., None], torch.log(total)
        """,
        "all-empty rows not guarded (-inf - -inf)": """
            top = lse.amax(dim=-1, keepdim=True)
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
            return summed / torch.where(total > 0, total, 1.0)[..., None], torch.log(total) + top[..., 0]
        """,
        "an empty split's NaN partial times weight 0": """
            top = lse.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            summed = (w[..., None] * partial).sum(dim=-2)
            return summed / torch.where(total > 0, total, 1.0)[..., None], torch.log(total) + top[..., 0]
        """,
        "plain mean of the non-empty splits": """
            keep = torch.isfinite(lse)
            n = keep.sum(dim=-1)
            summed = torch.where(keep[..., None], partial, 0.0).sum(dim=-2)
            top = lse.amax(dim=-1)
            return summed / torch.where(n > 0, n, 1)[..., None], top
        """,
        "merged lse is the largest split's lse": """
            top = lse.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
            return summed / torch.where(total > 0, total, 1.0)[..., None], lse.amax(dim=-1)
        """,
    },
}

# Wrong answers that pass the hand-made cases: inputs changed, right at one position of the batch only.
MUTANTS["ch04.ex1"].update(
    {
        "rescales the caller's l and acc in place": """
            m_new = torch.maximum(m, scores.amax(dim=-1))
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[:, None])
            l.mul_(alpha).add_(p.sum(dim=-1))
            acc.mul_(alpha[:, None]).add_(p @ values)
            return m_new, l, acc
        """,
        "the block max over the whole batch (amax without dim=-1)": """
            m_new = torch.maximum(m, scores.amax())
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[:, None])
            return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values
        """,
        "the masked-row guard only when the whole block is masked": """
            if torch.isinf(scores).all():
                return m, l, acc
            m_new = torch.maximum(m, scores.amax(dim=-1))
            alpha = torch.exp(m - m_new)
            p = torch.exp(scores - m_new[:, None])
            return m_new, l * alpha + p.sum(dim=-1), acc * alpha[:, None] + p @ values
        """,
    }
)
MUTANTS["ch04.ex2"].update(
    {
        "every sequence reads the first row of the block table (no row stride)": _swap(
            _KERNEL,
            "physical = tl.load(BT + seq * stride_bt_seq + b).to(tl.int64)",
            "physical = tl.load(BT + b).to(tl.int64)",
        ),
        "every query head group reads KV head 0 (no head offset)": _swap(
            _KERNEL, " + kv_head * stride_k_head", ""
        ),
        "the tail mask counts from the split's first block (right for split 0 only)": _swap(
            _KERNEL,
            "t_mask = b * BLOCK_SIZE + offs_t < context_len",
            "t_mask = (b - first) * BLOCK_SIZE + offs_t < context_len",
        ),
    }
)
MUTANTS["ch04.ex4"].update(
    {
        "cleans the empty splits' NaN in the caller's partial (in place)": """
            partial.nan_to_num_(0.0)
            top = lse.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            out = (w[..., None] * partial).sum(dim=-2) / torch.where(total > 0, total, 1.0)[..., None]
            return out, torch.log(total) + top[..., 0]
        """,
        "shifts by the first split's lse instead of the largest": """
            top = lse[..., :1]
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
            out = summed / torch.where(total > 0, total, 1.0)[..., None]
            return out, torch.log(total) + top[..., 0]
        """,
        "the merged lse forgets to add the shift back": """
            top = lse.amax(dim=-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
            w = torch.exp(lse - top)
            total = w.sum(dim=-1)
            summed = (w[..., None] * torch.where(w[..., None] > 0, partial, 0.0)).sum(dim=-2)
            out = summed / torch.where(total > 0, total, 1.0)[..., None]
            return out, torch.log(total)
        """,
    }
)
