"""Launch shapes of the native/ kernels: the grid and block each kernel's indexing expects
(the comment at the top of each .cu file), for the sizes of one call. Pure arithmetic, so
the host side of the CUDA path is checked without a GPU (tests/test_cuda_backend.py)."""

from __future__ import annotations

from dataclasses import dataclass

WARP = 32
MATVEC_ROWS = 4  # EK_ROWS_PER_BLOCK in matvec.cu: rows (warps) per block
MATMUL_TOKENS = 8  # EK_MATMUL_TOKENS in matvec.cu: tokens per warp of ek_matmul_*
ELEMENTWISE_THREADS = 256
ELEMENTWISE_MAX_BLOCKS = 4096  # the kernels loop over the rest (grid-stride)
MAX_ROTATION = 256  # EK_MAX_ROTATION in rotate.cu
MAX_HEAD_DIM = 256  # EK_MAX_HEAD_DIM in ek_attention.cuh: a head's values one thread holds (and ek_kv_shift's x[])
MAX_GRID_YZ = 65535  # CUDA's limit on a grid's y and z dimensions (x: 2^31 - 1)


@dataclass(frozen=True)
class Launch:
    grid: tuple[int, ...]
    block: tuple[int, ...]

    def __post_init__(self):
        if any(n > MAX_GRID_YZ for n in self.grid[1:]):  # the driver would refuse it mid-step
            raise ValueError(f"grid {self.grid}: y and z may be at most {MAX_GRID_YZ} (cap the chunk: max_batch)")


def _blocks(n: int, per: int) -> int:
    return max(1, -(-n // per))


def matvec(n_rows: int, n_tok: int) -> Launch:
    """One warp per output row, MATVEC_ROWS rows per block; grid.y the tokens."""
    return Launch((_blocks(n_rows, MATVEC_ROWS), n_tok), (WARP, MATVEC_ROWS))


def matmul(n_rows: int, n_tok: int) -> Launch:
    """As matvec, each warp taking MATMUL_TOKENS tokens: grid.y covers them."""
    return Launch((_blocks(n_rows, MATVEC_ROWS), _blocks(n_tok, MATMUL_TOKENS)), (WARP, MATVEC_ROWS))


def quantize_q8_1(n_blocks: int, warps: int = 8) -> Launch:
    """One warp per 32 values."""
    return Launch((_blocks(n_blocks, warps),), (WARP * warps,))


def get_rows(n_tok: int, n_cols: int) -> Launch:
    """One block of 32 threads per (32 columns, token)."""
    return Launch((_blocks(n_cols, WARP), n_tok), (WARP,))


def rows(n_rows: int, dim: int) -> Launch:
    """One block per row (norms), a whole number of warps, at most 256 threads."""
    return Launch((n_rows,), (min(256, WARP * _blocks(dim, WARP)),))


def rope(half: int, n_heads: int, n_tok: int, threads: int = 64) -> Launch:
    """One thread per rotated pair."""
    return Launch((_blocks(half, threads), n_heads, n_tok), (threads,))


def elementwise(n: int) -> Launch:
    return Launch((min(_blocks(n, ELEMENTWISE_THREADS), ELEMENTWISE_MAX_BLOCKS),), (ELEMENTWISE_THREADS,))


def kv_write(items: int, threads: int = 128) -> Launch:
    """One thread per 32-value block (quantized cache types) or per value."""
    return Launch((_blocks(items, threads),), (threads,))


def attention(n_heads: int, n_tok: int) -> Launch:
    """One warp per (query head, token); also ek_attention_merge's shape."""
    return Launch((n_heads, n_tok), (WARP,))


SPLIT_SLOTS = 256  # slots per warp in split attention
SPLIT_MAX_TOKENS = 4  # more queries than this fill the GPU with (head, token) warps already
MAX_SPLITS = 64


def attention_splits(cap: int, n_tok: int) -> tuple[int, int]:
    """(ranges, slots per range) for attention over a ring of cap slots: (1, cap), the
    one-warp pass, for a short ring or many queries; else ranges of SPLIT_SLOTS slots (more
    each beyond MAX_SPLITS ranges). Decided by the ring's size, not its fill, so a captured
    decode step replays unchanged as the ring fills."""
    if n_tok > SPLIT_MAX_TOKENS or cap <= 2 * SPLIT_SLOTS:
        return 1, cap
    n = min(MAX_SPLITS, -(-cap // SPLIT_SLOTS))
    return n, -(-cap // n)


def attention_split(n_heads: int, n_tok: int, n_splits: int) -> Launch:
    """One warp per (query head, token, range of slots)."""
    return Launch((n_heads, n_tok, n_splits), (WARP,))


TALLY_WARPS = 4  # slots per block of ek_attention_tally (a warp each)


def attention_tally(cap: int, n_kv: int) -> Launch:
    """One warp per (slot, KV head) of a ring of cap slots."""
    return Launch((-(-cap // TALLY_WARPS), n_kv), (TALLY_WARPS * WARP,))


def rotate(n_values: int, r: int) -> Launch:
    """One block of r threads per run of r values."""
    if r > MAX_ROTATION or n_values % r:
        raise ValueError(f"cannot rotate {n_values} values in runs of {r} (at most {MAX_ROTATION})")
    return Launch((n_values // r,), (r,))
