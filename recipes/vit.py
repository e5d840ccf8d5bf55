"""A small Vision Transformer and its LightningModule, sized for 8x8 images such as scikit-learn's digits."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy


class Attention(nn.Module):
    """Multi-head self-attention computed with ``scaled_dot_product_attention``.

    The call goes through ``torch.nn.functional`` at run time (not a name imported once) so that
    lightning-gae can intercept it to record attention maps and their gradients.
    """

    def __init__(self, dim: int, heads: int, attn_dropout: float = 0.0, proj_dropout: float = 0.0) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        self.head_dim = dim // heads
        self.attn_dropout = attn_dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        # [B, N, 3*D] -> [3, B, heads, N, head_dim]
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(b, n, d)
        return self.proj_drop(self.proj(out))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 2.0, dropout: float = 0.0) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, attn_dropout=dropout, proj_dropout=dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, dim),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Vision Transformer with a CLS token at index 0 and a linear head on it.

    ``num_prefix_tokens`` and ``patch_size`` are read by lightning-gae's image modality to map token
    relevance back onto the patch grid.
    """

    num_prefix_tokens: int = 1

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_chans: int = 1,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size ({image_size}) must be divisible by patch_size ({patch_size})")
        self.image_size = image_size
        self.patch_size = patch_size
        self.grid_size = image_size // patch_size
        num_patches = self.grid_size**2

        self.patch_embed = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + num_patches, dim))
        self.pos_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.apply(_init_weights)

    def forward(self, x: Tensor) -> Tensor:
        """Map images ``[B, C, H, W]`` to logits ``[B, num_classes]``."""
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # [B, N_patches, D], row-major over the grid
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.pos_drop(x)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return self.head(x[:, 0])


def _init_weights(module: nn.Module) -> None:
    # Small truncated-normal linears train more stably than PyTorch's default uniform init in ViTs.
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class ViTClassifier(pl.LightningModule):
    """Image classification with :class:`ViT`: cross-entropy, AdamW and a per-step one-cycle schedule."""

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_chans: int = 1,
        num_classes: int = 10,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        dropout: float = 0.1,
        lr: float = 3e-3,
        weight_decay: float = 0.05,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = ViT(
            image_size=image_size,
            patch_size=patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            dim=dim,
            depth=depth,
            heads=heads,
            mlp_ratio=mlp_ratio,
            dropout=dropout,
        )
        # Separate metric objects so validation and test epochs accumulate independently.
        self.val_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def forward(self, x: Tensor) -> Tensor:
        """Return logits ``[B, num_classes]`` for images ``[B, C, H, W]``."""
        return self.model(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.test_acc(logits, y)
        self.log("test_loss", F.cross_entropy(logits, y))
        self.log("test_acc", self.test_acc, prog_bar=True)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        # Norms, biases and the learned tokens/position embeddings are not weight-decayed.
        decay, no_decay = [], []
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            (no_decay if param.ndim < 2 or name.endswith(("cls_token", "pos_embed")) else decay).append(param)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams.lr,
        )
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=self.hparams.lr,
            total_steps=int(self.trainer.estimated_stepping_batches),
            pct_start=0.15,
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
