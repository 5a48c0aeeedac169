"""Generate the simulator's per-layer tables from real architecture definitions (torch side).

For each architecture of the task catalog (``icefrog_slurm/sim/data/tasks.json``) this builds
the model in plain ``torch.nn`` on the meta device (no weights, no memory), runs one sample
through it under ``torch.utils.flop_counter.FlopCounterMode`` and records, per freezable unit
(stem, each residual / inverted-residual / encoder / recurrent block, head), the forward
FLOPs of one sample (2 FLOPs a multiply-add, the counter's convention) and the bytes of its
trainable parameters (fp32, 4 bytes each: what DDP all-reduces). BatchNorm running
statistics are buffers, not parameters, and are not counted.

torchvision is not used: the architectures follow the papers and the reference code Pollux
trained (kuangliu/pytorch-cifar for ResNet18 and MobileNetV2 on CIFAR10, torchvision's
ResNet50, Darknet-53 YOLOv3, Ho et al.'s CIFAR10 DDPM UNet, BERT-base, deepspeech.pytorch's
DeepSpeech2, NeuMF). LLaMA tables are produced analytically by
``icefrog_slurm.core.transformer_tables`` and are not generated here.

Usage (from the repository root, needs torch):
    python -m tools.gen_task_catalog [--out icefrog_slurm/sim/data/layers] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

BYTES_PER_PARAM = 4
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "icefrog_slurm" / "sim" / "data" / "layers"


class Units(nn.Module):
    """A model whose freezable units are its top-level children named in ``unit_names``,
    input side first (the order the forward pass reaches them)."""

    unit_names: list[str]


# --- ResNet18 / ResNet50 --------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.short(x))


class Head(nn.Module):
    """Global average pool and the classifier."""

    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SequentialUnits(Units):
    """Units applied one after another."""

    def __init__(self, units: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.unit_names = [name for name, _ in units]
        for name, module in units:
            self.add_module(name, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.unit_names:
            x = getattr(self, name)(x)
        return x


def resnet18_cifar() -> SequentialUnits:
    """ResNet18 for 32x32 CIFAR (kuangliu/pytorch-cifar): 3x3 stem, no max-pool."""
    units: list[tuple[str, nn.Module]] = [
        (
            "stem",
            nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU()),
        )
    ]
    cin = 64
    for stage, (cout, stride) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2)), start=1):
        for i in range(2):
            units.append((f"layer{stage}_{i}", BasicBlock(cin, cout, stride if i == 0 else 1)))
            cin = cout
    units.append(("head", Head(512, 10)))
    return SequentialUnits(units)


def resnet50_imagenet() -> SequentialUnits:
    """ResNet50 (torchvision layout, v1.5: stride on the 3x3 conv)."""
    stem = nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
    )
    units: list[tuple[str, nn.Module]] = [("stem", stem)]
    cin = 64
    for stage, (width, blocks, stride) in enumerate(
        ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)), start=1
    ):
        for i in range(blocks):
            units.append((f"layer{stage}_{i}", Bottleneck(cin, width, stride if i == 0 else 1)))
            cin = width * 4
    units.append(("head", Head(2048, 1000)))
    return SequentialUnits(units)


# --- MobileNetV2 (CIFAR) --------------------------------------------------------------------


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expansion: int, stride: int) -> None:
        super().__init__()
        hidden = cin * expansion
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expansion != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        self.body = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        return x + out if self.use_res else out


def mobilenetv2_cifar() -> SequentialUnits:
    """MobileNetV2 for CIFAR10 (kuangliu/pytorch-cifar: stride-1 stem and first stages)."""
    cfg = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1))
    cfg += ((6, 160, 3, 2), (6, 320, 1, 1))
    units: list[tuple[str, nn.Module]] = [
        (
            "stem",
            nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()),
        )
    ]
    cin, index = 32, 0
    for expansion, cout, blocks, stride in cfg:
        for i in range(blocks):
            units.append(
                (f"block{index}", InvertedResidual(cin, cout, expansion, stride if i == 0 else 1))
            )
            cin, index = cout, index + 1
    head = nn.Sequential(
        nn.Conv2d(320, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6(), Head(1280, 10)
    )
    units.append(("head", head))
    return SequentialUnits(units)


# --- YOLOv3 (Darknet-53 and three detection heads) ------------------------------------------


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1)
    )


class DarkResidual(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(c, c // 2, 1), conv_bn(c // 2, c, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class YoloHead(nn.Module):
    """Optional lateral (1x1 conv, 2x upsample, concat with a backbone route), the five-conv
    set, and the output (3x3 conv, 1x1 conv to 3 x (5 + classes))."""

    def __init__(self, cin: int, c: int, classes: int, lateral: int = 0) -> None:
        super().__init__()
        self.lateral = conv_bn(lateral, lateral // 2, 1) if lateral else None
        self.convset = nn.Sequential(
            conv_bn(cin, c, 1), conv_bn(c, 2 * c, 3), conv_bn(2 * c, c, 1), conv_bn(c, 2 * c, 3),
            conv_bn(2 * c, c, 1),
        )  # fmt: skip
        self.out = nn.Sequential(conv_bn(c, 2 * c, 3), nn.Conv2d(2 * c, 3 * (5 + classes), 1))

    def forward(
        self, x: torch.Tensor, route: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.lateral is not None and route is not None:
            x = torch.cat([F.interpolate(self.lateral(x), scale_factor=2.0), route], 1)
        branch = self.convset(x)
        return self.out(branch), branch


class YoloV3(Units):
    """YOLOv3 (Redmon and Farhadi 2018) on 416x416 inputs, PASCAL VOC's 20 classes."""

    def __init__(self, classes: int = 20) -> None:
        super().__init__()
        names: list[str] = ["stem"]
        self.stem = conv_bn(3, 32, 3)
        cin = 32
        self.routes: dict[str, int] = {}
        for stage, blocks in enumerate((1, 2, 8, 8, 4), start=1):
            cout = cin * 2
            self.add_module(f"down{stage}", conv_bn(cin, cout, 3, 2))
            names.append(f"down{stage}")
            for i in range(blocks):
                self.add_module(f"res{stage}_{i}", DarkResidual(cout))
                names.append(f"res{stage}_{i}")
            cin = cout
        self.head1 = YoloHead(1024, 512, classes)
        self.head2 = YoloHead(512 // 2 + 512, 256, classes, lateral=512)
        self.head3 = YoloHead(256 // 2 + 256, 128, classes, lateral=256)
        self.unit_names = [*names, "head1", "head2", "head3"]
        self.backbone = names

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routes: dict[str, torch.Tensor] = {}
        for name in self.backbone:
            x = getattr(self, name)(x)
            routes[name] = x
        out1, b1 = self.head1(x, None)
        out2, b2 = self.head2(b1, routes["res4_7"])
        out3, _ = self.head3(b2, routes["res3_7"])
        return torch.cat([o.flatten(1) for o in (out1, out2, out3)], 1)


# --- DDPM UNet (Ho et al. 2020, CIFAR10 configuration) --------------------------------------


class TimeEmbedding(nn.Module):
    def __init__(self, ch: int) -> None:
        super().__init__()
        self.ch = ch
        self.mlp = nn.Sequential(nn.Linear(ch, 4 * ch), nn.SiLU(), nn.Linear(4 * ch, 4 * ch))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.ch // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / (half - 1))
        args = t[:, None].float() * freqs[None]
        return self.mlp(torch.cat([args.sin(), args.cos()], 1))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int, attn: bool) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(32, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(32, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        self.attn = SelfAttention(cout) if attn else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.attn(self.skip(x) + h)


class SelfAttention(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(32, c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hgt, wid = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, hgt * wid).unbind(1)
        w = torch.softmax(torch.bmm(q.transpose(1, 2), k) / math.sqrt(c), dim=-1)
        h = torch.bmm(v, w.transpose(1, 2)).reshape(b, c, hgt, wid)
        return x + self.proj(h)


class DdpmStem(nn.Module):
    """The time embedding (used by every residual block) and the input convolution."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.temb = TimeEmbedding(ch)
        self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.conv_in(x), self.temb(torch.zeros(x.shape[0], device=x.device))


class DdpmMiddle(nn.Module):
    def __init__(self, c: int, tdim: int) -> None:
        super().__init__()
        self.block1 = ResBlock(c, c, tdim, True)
        self.block2 = ResBlock(c, c, tdim, False)

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        return self.block2(self.block1(x, temb), temb)


class DdpmUNet(Units):
    """The CIFAR10 DDPM UNet: ch 128, multipliers (1, 2, 2, 2), two residual blocks a level,
    attention at 16x16. Units: stem (time embedding + input conv), each down block and
    downsample, the middle, each up block and upsample, the output."""

    def __init__(self, ch: int = 128, mult: tuple[int, ...] = (1, 2, 2, 2)) -> None:
        super().__init__()
        tdim, res = 4 * ch, 32
        self.stem = DdpmStem(ch)
        self.down_names: list[str] = []
        chans, cin = [ch], ch
        for level, m in enumerate(mult):
            for i in range(2):
                self.add_module(f"down{level}_{i}", ResBlock(cin, ch * m, tdim, res == 16))
                self.down_names.append(f"down{level}_{i}")
                cin = ch * m
                chans.append(cin)
            if level < len(mult) - 1:
                self.add_module(f"downsample{level}", nn.Conv2d(cin, cin, 3, 2, 1))
                self.down_names.append(f"downsample{level}")
                chans.append(cin)
                res //= 2
        self.mid = DdpmMiddle(cin, tdim)
        self.up_names: list[str] = []
        for level in reversed(range(len(mult))):
            for i in range(3):
                cout = ch * mult[level]
                self.add_module(
                    f"up{level}_{i}", ResBlock(cin + chans.pop(), cout, tdim, res == 16)
                )
                self.up_names.append(f"up{level}_{i}")
                cin = cout
            if level > 0:
                self.add_module(f"upsample{level}", nn.Conv2d(cin, cin, 3, 1, 1))
                self.up_names.append(f"upsample{level}")
                res *= 2
        self.out = nn.Sequential(nn.GroupNorm(32, cin), nn.SiLU(), nn.Conv2d(cin, 3, 3, 1, 1))
        self.unit_names = ["stem", *self.down_names, "mid", *self.up_names, "out"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, temb = self.stem(x)
        hs = [first]
        for name in self.down_names:
            block = getattr(self, name)
            hs.append(block(hs[-1], temb) if isinstance(block, ResBlock) else block(hs[-1]))
        h = self.mid(hs[-1], temb)
        for name in self.up_names:
            block = getattr(self, name)
            if isinstance(block, ResBlock):
                h = block(torch.cat([h, hs.pop()], 1), temb)
            else:
                h = block(F.interpolate(h, scale_factor=2.0))
        return self.out(h)


# --- BERT-base (SQuAD), DeepSpeech2, NeuMF --------------------------------------------------


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d // self.heads), dim=-1)
        h = (w @ v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.proj(h))
        return self.ln2(x + self.ff(x))


class BertEmbeddings(nn.Module):
    def __init__(self, vocab: int, d: int, positions: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(positions, d)
        self.token_type = nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)[None]
        return self.ln(self.word(ids) + self.position(pos) + self.token_type(torch.zeros_like(ids)))


def bert_base_squad() -> SequentialUnits:
    """BERT-base (12 layers, hidden 768, 12 heads, FFN 3072) with the SQuAD span head."""
    units: list[tuple[str, nn.Module]] = [("embeddings", BertEmbeddings(30522, 768, 512))]
    units += [(f"encoder{i}", EncoderLayer(768, 12, 3072)) for i in range(12)]
    units.append(("qa_head", nn.Linear(768, 2)))
    return SequentialUnits(units)


class ConvUnit(nn.Module):
    def __init__(self, cin: int, cout: int, k: tuple[int, int], s: tuple[int, int]) -> None:
        super().__init__()
        pad = (k[0] // 2, k[1] // 2)
        self.conv = nn.Conv2d(cin, cout, k, s, pad, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardtanh(self.bn(self.conv(x)), 0, 20)


class RnnUnit(nn.Module):
    """Sequence-wise BatchNorm then a bidirectional LSTM whose directions are summed."""

    def __init__(self, cin: int, hidden: int, norm: bool) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(cin) if norm else None
        self.rnn = nn.LSTM(cin, hidden, bidirectional=True, bias=True)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (T, N, C)
        if self.norm is not None:
            t, n, c = x.shape
            x = self.norm(x.reshape(t * n, c)).reshape(t, n, c)
        out, _ = self.rnn(x)
        return out[..., : self.hidden] + out[..., self.hidden :]


class DeepSpeech2(Units):
    """DeepSpeech2 as in deepspeech.pytorch: two 2-D convs over a 161-bin spectrogram,
    five bidirectional LSTMs of 1024, a linear layer to 29 characters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvUnit(1, 32, (41, 11), (2, 2))
        self.conv2 = ConvUnit(32, 32, (21, 11), (2, 1))
        feat = 32 * 41
        for i in range(5):
            self.add_module(f"rnn{i}", RnnUnit(feat if i == 0 else 1024, 1024, i > 0))
        self.fc = nn.Sequential(nn.BatchNorm1d(1024), nn.Linear(1024, 29, bias=False))
        self.unit_names = ["conv1", "conv2", *(f"rnn{i}" for i in range(5)), "fc"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (N, 1, 161, T)
        x = self.conv2(self.conv1(x))
        n, c, f, t = x.shape
        x = x.reshape(n, c * f, t).permute(2, 0, 1)
        for i in range(5):
            x = getattr(self, f"rnn{i}")(x)
        t, n, c = x.shape
        return self.fc(x.reshape(t * n, c))


class NcfEmbeddings(nn.Module):
    def __init__(self, users: int, items: int, factors: int, mlp_dim: int) -> None:
        super().__init__()
        self.user_gmf = nn.Embedding(users, factors)
        self.item_gmf = nn.Embedding(items, factors)
        self.user_mlp = nn.Embedding(users, mlp_dim)
        self.item_mlp = nn.Embedding(items, mlp_dim)

    def forward(self, pair: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u, i = pair[:, 0], pair[:, 1]
        gmf = self.user_gmf(u) * self.item_gmf(i)
        return gmf, torch.cat([self.user_mlp(u), self.item_mlp(i)], 1)


class NeuMF(Units):
    """NeuMF (He et al. 2017) on MovieLens-1M: factors 32, three MLP layers (256-128-64-32)."""

    def __init__(self, users: int = 6040, items: int = 3706, factors: int = 32) -> None:
        super().__init__()
        self.embeddings = NcfEmbeddings(users, items, factors, factors * 4)
        dims = (factors * 8, factors * 4, factors * 2, factors)
        for i in range(3):
            self.add_module(f"mlp{i}", nn.Sequential(nn.Linear(dims[i], dims[i + 1]), nn.ReLU()))
        self.predict = nn.Linear(2 * factors, 1)
        self.unit_names = ["embeddings", "mlp0", "mlp1", "mlp2", "predict"]

    def forward(self, pair: torch.Tensor) -> torch.Tensor:
        gmf, mlp = self.embeddings(pair)
        for i in range(3):
            mlp = getattr(self, f"mlp{i}")(mlp)
        return self.predict(torch.cat([gmf, mlp], 1))


# --- The generator --------------------------------------------------------------------------

Builder = Callable[[], Units]
ARCHITECTURES: dict[str, tuple[Builder, Callable[[], torch.Tensor], str]] = {
    "resnet18-cifar10": (resnet18_cifar, lambda: torch.empty(1, 3, 32, 32), "image 3x32x32"),
    "resnet50-imagenet": (resnet50_imagenet, lambda: torch.empty(1, 3, 224, 224), "3x224x224"),
    "mobilenetv2-cifar10": (mobilenetv2_cifar, lambda: torch.empty(1, 3, 32, 32), "3x32x32"),
    "yolov3-voc": (YoloV3, lambda: torch.empty(1, 3, 416, 416), "image 3x416x416"),
    "ddpm-cifar10": (DdpmUNet, lambda: torch.empty(1, 3, 32, 32), "image 3x32x32"),
    "bert-base-squad": (
        bert_base_squad,
        lambda: torch.zeros(1, 384, dtype=torch.long),
        "384 tokens",
    ),
    "deepspeech2-arctic": (
        DeepSpeech2,
        lambda: torch.empty(1, 1, 161, 300),
        "spectrogram 161x300 (3 s, a typical CMU ARCTIC utterance)",
    ),
    "ncf-movielens": (NeuMF, lambda: torch.zeros(1, 2, dtype=torch.long), "one (user, item) pair"),
}


def layer_table(name: str) -> dict[str, Any]:
    """The JSON document of one architecture's per-unit forward FLOPs and parameter bytes."""
    build, make_input, described = ARCHITECTURES[name]
    with torch.device("meta"):
        model = build()
        sample = make_input()
    model.eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(sample)
    counts = counter.get_flop_counts()
    root = type(model).__name__
    layers = []
    for unit in model.unit_names:
        flops = sum(counts.get(f"{root}.{unit}", {}).values())
        params = sum(p.numel() for p in getattr(model, unit).parameters() if p.requires_grad)
        layers.append({"name": unit, "flops": float(flops), "param_bytes": float(params * 4)})
    total = float(counter.get_total_flops())
    covered = sum(layer["flops"] for layer in layers)
    if abs(covered - total) > 1e-6 * total:
        raise RuntimeError(f"{name}: units cover {covered} of {total} FLOPs")
    all_params = sum(p.numel() for p in model.parameters())
    if sum(layer["param_bytes"] for layer in layers) != all_params * BYTES_PER_PARAM:
        raise RuntimeError(f"{name}: units do not cover every parameter")
    return {
        "name": name,
        "generator": "tools/gen_task_catalog.py",
        "torch": torch.__version__.split("+")[0],
        "input": f"one sample: {described}",
        "flops": "forward FLOPs of one sample (torch.utils.flop_counter, 2 a multiply-add)",
        "bytes_per_param": BYTES_PER_PARAM,
        "total_flops": total,
        "total_params": all_params,
        "layers": layers,
    }


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", choices=sorted(ARCHITECTURES), action="append")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or sorted(ARCHITECTURES):
        doc = layer_table(name)
        (args.out / f"{name}.json").write_text(render(doc), encoding="utf-8")
        print(f"{name}: {len(doc['layers'])} layers, {doc['total_flops'] / 1e9:.3f} GFLOPs, "
              f"{doc['total_params'] / 1e6:.2f} M params")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
