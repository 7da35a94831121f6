"""Differentiable JPEG (baseline, 4:2:0) on float batches: the DiffJPEG model Real-ESRGAN trains with.

RGB -> YCbCr (JFIF), 2x2 chroma average, 8x8 DCT, quantisation by the libjpeg tables of Annex K scaled by
the IJG quality rule, rounding, then the inverse chain. It is not libjpeg: no entropy coding, chroma is
upsampled by pixel repetition and the image is zero-padded to a multiple of 16. The float32 operations
are ordered like BasicSR's ``basicsr/utils/diffjpeg.py`` so results are ``torch.equal`` to its on CPU."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

# ITU-T T.81 Annex K luminance and chrominance tables (row = vertical frequency), stored transposed
# because blocks are laid out (x, y) below.
_LUMA = np.array(
    [[16, 11, 10, 16, 24, 40, 51, 61], [12, 12, 14, 19, 26, 58, 60, 55], [14, 13, 16, 24, 40, 57, 69, 56],
     [14, 17, 22, 29, 51, 87, 80, 62], [18, 22, 37, 56, 68, 109, 103, 77], [24, 35, 55, 64, 81, 104, 113, 92],
     [49, 64, 78, 87, 103, 121, 120, 101], [72, 92, 95, 98, 112, 100, 103, 99]], dtype=np.float32).T  # fmt: skip
_CHROMA = np.full((8, 8), 99, dtype=np.float32)
_CHROMA[:4, :4] = np.array([[17, 18, 24, 47], [18, 21, 26, 66], [24, 26, 56, 99], [47, 66, 99, 99]]).T
_TO_YCC = np.array([[0.299, 0.587, 0.114], [-0.168736, -0.331264, 0.5], [0.5, -0.418688, -0.081312]], dtype=np.float32).T
_TO_RGB = np.array([[1.0, 0.0, 1.402], [1, -0.344136, -0.714136], [1, 1.772, 0]], dtype=np.float32).T


def _cosines() -> np.ndarray:
    """c[x, u] = cos((2x + 1) u pi / 16), float64."""
    n = np.arange(8)
    return np.cos(np.outer(2 * n + 1, n) * np.pi / 16)


def quality_to_factor(quality: torch.Tensor) -> torch.Tensor:
    """IJG scaling of the base tables: 50/q below quality 50, 2 - q/50 above (float32, no mutation)."""
    q = quality.float()
    return torch.where(q < 50, 5000.0 / q, 200.0 - q * 2) / 100.0


class DiffJPEG(torch.nn.Module):
    """``forward(x, quality)``: x ``[B, 3, H, W]`` RGB in [0, 1], quality a float ``[B]`` tensor (1..100)."""

    dct: torch.Tensor
    idct: torch.Tensor
    dct_scale: torch.Tensor
    idct_alpha: torch.Tensor
    luma: torch.Tensor
    chroma: torch.Tensor
    to_ycc: torch.Tensor
    to_rgb: torch.Tensor
    ycc_shift: torch.Tensor
    rgb_shift: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        c = _cosines()
        alpha = np.array([1.0 / np.sqrt(2)] + [1.0] * 7)
        fwd = np.einsum("xu,yv->xyuv", c, c)  # DCT-II basis, one product per tap like the reference
        inv = np.einsum("ux,vy->xyuv", c, c)
        self.register_buffer("dct", torch.from_numpy(fwd).float().reshape(64, 64), persistent=False)
        self.register_buffer("idct", torch.from_numpy(inv).float().reshape(64, 64), persistent=False)
        self.register_buffer("dct_scale", torch.from_numpy(np.outer(alpha, alpha) * 0.25).float(), persistent=False)
        self.register_buffer("idct_alpha", torch.from_numpy(np.outer(alpha, alpha)).float(), persistent=False)
        self.register_buffer("luma", torch.from_numpy(_LUMA), persistent=False)
        self.register_buffer("chroma", torch.from_numpy(_CHROMA), persistent=False)
        self.register_buffer("to_ycc", torch.from_numpy(_TO_YCC), persistent=False)
        self.register_buffer("to_rgb", torch.from_numpy(_TO_RGB), persistent=False)
        self.register_buffer("ycc_shift", torch.tensor([0.0, 128.0, 128.0]), persistent=False)
        self.register_buffer("rgb_shift", torch.tensor([0.0, -128.0, -128.0]), persistent=False)

    @staticmethod
    def _blocks(plane: torch.Tensor) -> torch.Tensor:
        """[B, H, W] -> [B, H*W/64, 64], blocks in raster order."""
        b, h, w = plane.shape
        return plane.view(b, h // 8, 8, w // 8, 8).permute(0, 1, 3, 2, 4).reshape(b, -1, 64)

    @staticmethod
    def _unblocks(blocks: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b = blocks.shape[0]
        return blocks.view(b, h // 8, w // 8, 8, 8).permute(0, 1, 3, 2, 4).reshape(b, h, w)

    def _roundtrip(self, plane: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """One channel through DCT, quantisation by ``table`` [B, 1, 8, 8], rounding and back."""
        b, h, w = plane.shape
        coef = self.dct_scale * (self._blocks(plane - 128) @ self.dct).view(b, -1, 8, 8)
        q = torch.round(coef / table) * table
        pix = 0.25 * ((q * self.idct_alpha).reshape(b, -1, 64) @ self.idct) + 128
        return self._unblocks(pix, h, w)

    def forward(self, x: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
        b, _, h, w = x.shape
        ph, pw = -h % 16, -w % 16
        x = F.pad(x, (0, pw, 0, ph), mode="constant", value=0)
        ycc = (x * 255).permute(0, 2, 3, 1) @ self.to_ycc + self.ycc_shift  # [B, H, W, 3]
        factor = quality_to_factor(quality.to(x.device)).view(b, 1, 1, 1)
        luma_t = self.luma.expand(b, 1, 8, 8) * factor
        chroma_t = self.chroma.expand(b, 1, 8, 8) * factor
        y = self._roundtrip(ycc[..., 0], luma_t)
        planes = [y]
        for ch in (1, 2):
            plane = ycc[..., ch].unsqueeze(1).contiguous()
            sub = F.avg_pool2d(plane, kernel_size=2, stride=2, count_include_pad=False).squeeze(1)
            rec = self._roundtrip(sub, chroma_t)
            planes.append(rec.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2))
        rgb = (torch.stack(planes, dim=3) + self.rgb_shift) @ self.to_rgb
        return (rgb.clamp(0, 255).permute(0, 3, 1, 2) / 255)[:, :, :h, :w]
