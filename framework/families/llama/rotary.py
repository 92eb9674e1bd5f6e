"""Rotary position embeddings (RoPE), with Llama-3.1's frequency scaling.

Each pair of channels (i, i + D/2) of a query or key at position m is rotated by the
angle m·ω_i, ω_i = θ^(-2i/D), so a query-key score depends on their distance only.
Channels are paired by halves (the "rotate half" layout of Hugging Face's Llama
checkpoints), not interleaved: the layout is part of the weights' meaning.

``rope_type="llama3"`` (Llama 3.1+) leaves the high frequencies alone, divides the
low ones by ``factor`` and interpolates smoothly in between, in wavelengths measured
against the original context length.
"""

from __future__ import annotations

import math

import torch

from framework.config import ModelConfig


def rotary_frequencies(cfg: ModelConfig, device: torch.device | str | None = None) -> torch.Tensor:
    """ω_i for i = 0..D/2-1, float32 [D/2]."""
    exponents = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64, device=device).float() / cfg.head_dim
    frequencies = 1.0 / (cfg.rope_theta ** exponents)
    if cfg.rope_type == "llama3":
        frequencies = llama3_scaled(frequencies, cfg)
    return frequencies


def llama3_scaled(frequencies: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Llama-3.1's scaling: wavelengths shorter than original/high_freq_factor are kept,
    longer than original/low_freq_factor are stretched by ``factor``, and the band
    between blends the two linearly in original/wavelength."""
    factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    original = cfg.rope_original_max_seq_len
    wavelengths = 2 * math.pi / frequencies
    stretched = frequencies / factor
    blend = (original / wavelengths - low) / (high - low)
    middle = (1 - blend) * stretched + blend * frequencies
    scaled = torch.where(wavelengths > original / low, stretched, frequencies)
    in_band = (wavelengths >= original / high) & (wavelengths <= original / low)
    return torch.where(in_band, middle, scaled)


def rotary_cos_sin(frequencies: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, T, D] (B may be 1) of the angles positions [B, T] · ω, float32."""
    angles = positions.to(torch.float32)[..., None] * frequencies.to(positions.device)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D] rotated by the angles of cos/sin [B, T, D]."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


__all__ = ["rotary_frequencies", "llama3_scaled", "rotary_cos_sin", "rotate"]
