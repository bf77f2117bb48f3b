"""The preset's geometry (imagenet resize + center crop, yolo letterbox, plain resize) for a batch of images of
different sizes as two batched matrix products on the GPU, whatever the number of sizes.

Why: nvJPEG hands back one image per file, each its own size. Resizing them with ``F.interpolate`` needs one call
per size (a batch of 64 photographs had ~30 sizes: ~8 GPU operations each), and inside `batch` every operation
gives the GIL up and waits to take it back behind the job's other threads, so the same resize took several times
longer inside the job than alone (docs/BENCHMARKS.md and its history). An antialiased bilinear resize is separable
and linear: out = Wy @ X @ Wx^T per channel, with Wy [out_h, in_h] and Wx [out_w, in_w] holding a few taps per
row. The crop (or the letterbox's placement) only picks which output rows and columns exist, so it folds into the
same matrices. Images are placed in one padded batch (the padding is left unwritten: it meets zero weights); a
batch whose padded copy would pass MAX_BATCH_BYTES (large photographs) is resampled in consecutive chunks.

The weights are those of ``torch.nn.functional.interpolate(mode="bilinear", antialias=True, align_corners=False)``
(aten/src/ATen/native/UpSample.h, ``compute_indices_weights_aa``), which follows Pillow's BILINEAR resize
(src/libImaging/Resample.c, ``precompute_coeffs``): for output index i at scale s = in/out, center = s * (i + 0.5),
support = max(s, 1), taps j in [int(center - support + 0.5), int(center + support + 0.5)) clipped to the image,
weight = max(0, 1 - |(j - center + 0.5) / max(s, 1)|), normalised to sum 1. tests/prepost/test_resample.py holds
them against Pillow's resize of real photographs.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from onnxaccel.inputs_files import ImagePreprocess


@lru_cache(maxsize=4096)
def aa_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased bilinear resize of one axis, ``in_size`` -> ``out_size``: per output index the first input
    index [out_size] (int64) and the weights of the taps from there [out_size, K] (float32, zero past the image)."""
    scale = in_size / out_size
    support = scale if scale >= 1.0 else 1.0
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    center = scale * (np.arange(out_size) + 0.5)
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)  # astype truncates toward zero, as C++
    end = np.minimum((center + support + 0.5).astype(np.int64), in_size)
    taps = int((end - first).max())
    j = np.arange(taps)
    weights = np.clip(1.0 - np.abs((j[None, :] + first[:, None] - center[:, None] + 0.5) * invscale), 0.0, None)
    weights[j[None, :] >= (end - first)[:, None]] = 0.0
    weights /= weights.sum(axis=1, keepdims=True)
    return first, weights.astype(np.float32)


@lru_cache(maxsize=4096)
def axis_plan(in_size: int, out_size: int, resized: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """One axis of the geometry: the image's ``in_size`` resized to ``resized``; output index o (of ``out_size``)
    shows resized index o + offset (offset > 0: a crop; < 0: placed inside a padded canvas). Per output index the
    first input index and its tap weights (a row of zeros where the output shows no image)."""
    if resized == in_size:
        first, weights = np.arange(in_size, dtype=np.int64), np.ones((in_size, 1), np.float32)
    else:
        first, weights = aa_taps(in_size, resized)
    rows = np.arange(out_size) + offset
    inside = (rows >= 0) & (rows < resized)
    firsts = np.zeros(out_size, np.int64)
    taps = np.zeros((out_size, weights.shape[1]), np.float32)
    firsts[inside], taps[inside] = first[rows[inside]], weights[rows[inside]]
    return firsts, taps


def geometry_plan(h0: int, w0: int, height: int, width: int, pre: ImagePreprocess):
    """The preset's geometry for one image of h0 x w0 as (rows plan, columns plan, pad): each plan is axis_plan's
    (first input index, weights) over the output's rows / columns; pad is the letterbox's fill value (yolo) or
    None. Sizes and rounding as NvjpegDecoder's per-size geometry and inputs_files.apply_geometry."""
    if (h0, w0) == (height, width) and pre.preset != "yolo":  # already the model's size: fed as it is
        return axis_plan(h0, height, h0, 0), axis_plan(w0, width, w0, 0), None
    if pre.preset == "imagenet":
        short = pre.resize or round(min(height, width) * 256 / 224)
        scale = short / min(h0, w0)
        nh, nw = max(height, round(h0 * scale)), max(width, round(w0 * scale))
        return (axis_plan(h0, height, nh, (nh - height) // 2), axis_plan(w0, width, nw, (nw - width) // 2), None)
    if pre.preset == "yolo":
        r = min(height / h0, width / w0)
        nh, nw = max(1, round(h0 * r)), max(1, round(w0 * r))
        return (axis_plan(h0, height, nh, -((height - nh) // 2)), axis_plan(w0, width, nw, -((width - nw) // 2)),
                float(pre.pad_value))
    if (h0, w0) == (height, width):
        return axis_plan(h0, height, h0, 0), axis_plan(w0, width, w0, 0), None
    return axis_plan(h0, height, height, 0), axis_plan(w0, width, width, 0), None


def dense(plan: tuple[np.ndarray, np.ndarray], in_size: int) -> np.ndarray:
    """A plan as the dense matrix [out, in_size] (tests and the CPU reference)."""
    first, weights = plan
    matrix = np.zeros((first.shape[0], in_size), np.float64)
    for o in range(first.shape[0]):
        for k, w in enumerate(weights[o]):
            if w:
                matrix[o, first[o] + k] += w
    return matrix


def resample_numpy(img: np.ndarray, height: int, width: int, pre: ImagePreprocess) -> np.ndarray:
    """One uint8 HWC image by the preset, on the CPU with the same matrices (the reference the tests compare with
    Pillow and the GPU path with)."""
    h0, w0 = img.shape[:2]
    rows, cols, pad = geometry_plan(h0, w0, height, width, pre)
    wy, wx = dense(rows, h0), dense(cols, w0)
    out = np.einsum("yi,ixc->yxc", wy, np.einsum("ijc,xj->ixc", img.astype(np.float64), wx, optimize=True),
                    optimize=True)
    if pad is not None:
        out += pad * (1.0 - wy.sum(1)[:, None, None] * wx.sum(1)[None, :, None])
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


class BatchResampler:
    """The geometry of a list of [3, h, w] uint8 images on one CUDA device (torch) as [n, H, W, 3] uint8: the images
    copied into one padded [n, 3, h_max, w_max] batch (one copy each), the tap plans gathered on the host and sent
    in one page-locked buffer, the dense matrices built on the device (scatter), two batched products in FP32,
    rounding. About n + 12 GPU operations for any mix of sizes."""

    #: Bytes the padded FP32 copy of a batch may take (3 channels x 4 bytes per padded pixel); a larger batch is
    #: resampled in consecutive chunks that each stay under it (one image larger than this is a chunk of its own).
    MAX_BATCH_BYTES = 512 << 20

    def __init__(self, torch, device: str, height: int, width: int, pre: ImagePreprocess):
        self.torch, self.device = torch, device
        self.height, self.width, self.pre = height, width, pre
        self._host = None  # page-locked float32 staging for the tap plans, grown as needed
        self._copied = None  # a CUDA event after the last copy out of _host: wait for it before writing _host again

    def __call__(self, images: list):
        sizes = [tuple(int(d) for d in img.shape[1:]) for img in images]
        chunks, first, h_max, w_max = [], 0, 0, 0
        for k, (h, w) in enumerate(sizes):
            h_max, w_max = max(h_max, h), max(w_max, w)
            if k > first and (k - first + 1) * h_max * w_max * 12 > self.MAX_BATCH_BYTES:
                chunks.append((first, k))
                first, h_max, w_max = k, h, w
        chunks.append((first, len(images)))
        if len(chunks) == 1:
            return self._resample(images, sizes)
        return self.torch.cat([self._resample(images[a:b], sizes[a:b]) for a, b in chunks])

    def _resample(self, images: list, sizes: list[tuple[int, int]]):
        torch = self.torch
        n, height, width = len(images), self.height, self.width
        h_max, w_max = max(h for h, _ in sizes), max(w for _, w in sizes)
        plans = [geometry_plan(h, w, height, width, self.pre) for h, w in sizes]
        ky = max(p[0][1].shape[1] for p in plans)
        kx = max(p[1][1].shape[1] for p in plans)
        # One host array: [rows first (n*H) | rows weights (n*H*ky) | cols first (n*W) | cols weights (n*W*kx) |
        # pad per image (n)], float32 (indices below 2^24 are exact), sent at once.
        parts = [n * height, n * height * ky, n * width, n * width * kx, n]
        total = sum(parts)
        if self._copied is not None:
            self._copied.synchronize()  # the previous batch's (or chunk's) plans have left the buffer
        if self._host is None or self._host.shape[0] < total:
            self._host = torch.empty(max(total, 1 << 16), dtype=torch.float32,
                                     pin_memory=self.device.startswith("cuda"))
        host = self._host[:total].numpy()
        at = np.cumsum([0, *parts])
        fy, wy = host[at[0]:at[1]].reshape(n, height), host[at[1]:at[2]].reshape(n, height, ky)
        fx, wx = host[at[2]:at[3]].reshape(n, width), host[at[3]:at[4]].reshape(n, width, kx)
        pads = host[at[4]:at[5]]
        wy[:], wx[:] = 0.0, 0.0
        for k, ((first_y, taps_y), (first_x, taps_x), pad) in enumerate(plans):
            fy[k], wy[k, :, :taps_y.shape[1]] = first_y, taps_y
            fx[k], wx[k, :, :taps_x.shape[1]] = first_x, taps_x
            pads[k] = pad if pad is not None else 0.0
        staged = self._host[:total].to(self.device, non_blocking=True)
        if self.device.startswith("cuda"):
            self._copied = torch.cuda.Event()
            self._copied.record()  # on the current stream, behind the copy
        dev = [staged[at[i]:at[i + 1]] for i in range(5)]
        my = self._dense(dev[0].view(n, height), dev[1].view(n, height, ky), h_max)  # [n, H, h_max]
        mx = self._dense(dev[2].view(n, width), dev[3].view(n, width, kx), w_max)  # [n, W, w_max]
        # Padding needs no clearing: it meets zero weights (uint8 garbage times 0.0 is 0.0).
        batch = torch.empty((n, 3, h_max, w_max), dtype=torch.uint8, device=self.device)
        for k, img in enumerate(images):
            h, w = sizes[k]
            batch[k, :, :h, :w].copy_(img)
        x = batch.float().view(n, 3 * h_max, w_max)
        x = torch.bmm(x, mx.transpose(1, 2)).view(n, 3, h_max, width)  # columns: [n, 3, h_max, W]
        out = torch.matmul(my.unsqueeze(1), x)  # rows: [n, 3, H, W]
        if any(p[2] is not None for p in plans):  # letterbox: the fill where no image is shown
            shown = my.sum(2)[:, :, None] * mx.sum(2)[:, None, :]  # [n, H, W]: 1 inside, 0 outside
            out += (dev[4][:, None, None] * (1.0 - shown))[:, None]
        out = out.round_().clamp_(0, 255).permute(0, 2, 3, 1)
        return out.to(torch.uint8).contiguous()

    def _dense(self, first, weights, size: int):
        """[n, out, size] from first indices [n, out] and tap weights [n, out, K] (zero taps add nothing)."""
        torch = self.torch
        n, out, taps = weights.shape
        index = (first.long()[:, :, None] + torch.arange(taps, device=self.device)).clamp_(max=size - 1)
        return torch.zeros((n, out, size), dtype=torch.float32, device=self.device).scatter_add_(2, index, weights)
