"""Transformer host (shapes, causality, slots, tied head, presets) and the transformer seed blueprints."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from esper_ray.contracts.actions import CNN_BLUEPRINTS, TRANSFORMER_BLUEPRINTS, Blueprint
from esper_ray.contracts.transformer_host import TransformerHostConfig
from esper_ray.env.train_step import prediction_loss
from esper_ray.morpho.blueprints import count_params
from esper_ray.morpho.transformer import TRANSFORMER_PRESETS, TransformerHost
from esper_ray.morpho.transformer_blueprints import (
    AttentionSeed,
    FlexAttentionSeed,
    build_transformer_seed,
    flex_attention_available,
    resolve_transformer_blueprint,
    seed_heads,
)

SMALL = TransformerHostConfig(vocab_size=256, seq_len=16, d_model=32, n_heads=4, n_layers=3)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # where the learning tests run
FLEX_OK, FLEX_REASON = flex_attention_available(DEVICE)


def small_host(seed: int = 0) -> TransformerHost:
    torch.manual_seed(seed)
    return TransformerHost(SMALL).eval()


def tokens(batch: int = 3, length: int = SMALL.seq_len, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(seed))


def seed_for(blueprint: Blueprint, channels: int) -> nn.Module:
    """Built through the registry; flex_attention's class directly where it cannot train on the CPU."""
    if blueprint is Blueprint.FLEX_ATTENTION and not FLEX_OK:
        return FlexAttentionSeed(channels)
    return build_transformer_seed(blueprint, channels, DEVICE)


# ---------------------------------------------------------------------------------------------- host


def test_logits_have_one_row_per_position_over_the_byte_vocabulary():
    host = small_host()
    assert host(tokens()).shape == (3, SMALL.seq_len, 256)
    assert host(tokens(length=5)).shape == (3, 5, 256)  # shorter sequences than the block size work
    with pytest.raises(ValueError, match="exceeds the host's seq_len=16"):
        host(tokens(length=17))


def test_changing_token_t_changes_no_logit_before_t():
    host = small_host()
    idx = tokens()
    t = 7
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % 256
    with torch.no_grad():
        a, b = host(idx), host(changed)
    assert torch.equal(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


def test_slot_hook_sees_every_slot_once_in_order_with_the_residual_stream():
    host = small_host()
    calls: list[tuple[str, tuple[int, ...]]] = []

    def hook(slot: str, h: torch.Tensor) -> torch.Tensor:
        calls.append((slot, tuple(h.shape)))
        return h

    host(tokens(batch=2), at_slot=hook)
    assert host.slot_ids == ["r0c0", "r0c1", "r0c2"]
    assert calls == [(s, (2, SMALL.seq_len, SMALL.d_model)) for s in host.slot_ids]
    assert all(host.slot_channels(s) == 32 and host.slot_shape(s) == (16, 32) for s in host.slot_ids)


def test_identity_hook_leaves_logits_unchanged_and_a_real_hook_changes_them():
    host = small_host()
    idx = tokens()
    with torch.no_grad():
        plain = host(idx)
        assert torch.equal(host(idx, at_slot=lambda s, h: h), plain)
        assert not torch.allclose(host(idx, at_slot=lambda s, h: h * 2 if s == "r0c1" else h), plain)


def test_hook_output_replaces_the_stream_after_its_block():
    """Zeroing the stream at the last slot leaves only ln_f's bias: every position gets the same logits."""
    host = small_host()
    with torch.no_grad():
        nn.init.normal_(host.ln_f.bias)
        logits = host(tokens(), at_slot=lambda s, h: torch.zeros_like(h) if s == "r0c2" else h)
    expected = host.ln_f.bias @ host.tok_emb.weight.T
    assert torch.allclose(logits, expected.expand_as(logits), atol=1e-6)


def test_output_head_is_tied_to_the_byte_embedding():
    host = small_host()
    assert host.head.weight is host.tok_emb.weight
    assert "head.weight" not in dict(host.named_parameters())  # one [vocab, d_model] matrix, counted once
    assert count_params(host) == hand_param_count(SMALL)
    idx = tokens()
    prediction_loss(host(idx), tokens(seed=2)).backward()
    assert host.tok_emb.weight.grad is not None and host.tok_emb.weight.grad.abs().sum() > 0


def test_the_training_steps_loss_is_the_mean_cross_entropy_over_every_byte_and_every_image():
    """env/train_step.py's step trains on prediction_loss: per token for text (every position predicts a byte), per
    sample for images."""
    logits = torch.randn(2, 3, 256)
    targets = torch.randint(0, 256, (2, 3))
    by_hand = -torch.stack([logits[b, t].log_softmax(-1)[targets[b, t]] for b in range(2) for t in range(3)]).mean()
    assert torch.allclose(prediction_loss(logits, targets), by_hand, atol=1e-6)
    images, labels = torch.randn(4, 10), torch.tensor([0, 3, 9, 3])
    by_hand = -torch.stack([images[b].log_softmax(-1)[labels[b]] for b in range(4)]).mean()
    assert torch.allclose(prediction_loss(images, labels), by_hand, atol=1e-6)


def hand_param_count(cfg: TransformerHostConfig) -> int:
    d, h = cfg.d_model, cfg.mlp_hidden
    block = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d)
    return cfg.vocab_size * d + cfg.seq_len * d + cfg.n_layers * block + 2 * d


@pytest.mark.parametrize("name", sorted(TRANSFORMER_PRESETS))
def test_presets_build_run_and_match_their_stated_parameter_counts(name):
    cfg = TRANSFORMER_PRESETS[name]
    host = TransformerHost(cfg)
    assert count_params(host) == hand_param_count(cfg)
    assert count_params(host) == {"text": 170_560, "text-gpu": 4_870_144, "text-starved": 170_560}[name]
    with torch.no_grad():
        assert host(torch.zeros(1, 4, dtype=torch.int64)).shape == (1, 4, 256)


def test_unknown_slot_error_lists_the_available_slots():
    host = small_host()
    with pytest.raises(ValueError, match=r"slot 'r0c3' does not exist.*\['r0c0', 'r0c1', 'r0c2'\]"):
        host.slot_channels("r0c3")
    with pytest.raises(ValueError, match=r"slot 'r1c0' does not exist"):
        host.slot_shape("r1c0")
    with pytest.raises(ValueError, match="bad slot name"):
        host.slot_channels("layer0")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n_heads", 5, "n_heads=5 does not divide d_model=64"),
        ("d_model", 0, "d_model=0: must be an integer >= 1"),
        ("seq_len", 2.5, "seq_len=2.5"),
        ("dropout", 1.0, r"dropout=1.0: must be a number in \[0, 1\)"),
    ],
)
def test_host_config_rejects_bad_values_by_name(field, value, message):
    with pytest.raises(ValueError, match=message):
        TransformerHostConfig(**{field: value})


# ---------------------------------------------------------------------------------------------- seeds


@pytest.mark.parametrize("channels", [64, 30, 7])
@pytest.mark.parametrize("blueprint", TRANSFORMER_BLUEPRINTS, ids=lambda b: b.key)
def test_every_transformer_seed_is_the_identity_at_birth(blueprint, channels):
    torch.manual_seed(0)
    seed = seed_for(blueprint, channels)
    x = torch.randn(2, 8, channels) * 3
    with torch.no_grad():
        out = seed(x)
    assert out.shape == x.shape
    assert torch.equal(out, x)


@pytest.mark.parametrize("blueprint", TRANSFORMER_BLUEPRINTS, ids=lambda b: b.key)
def test_every_transformer_seed_learns_from_birth(blueprint):
    """At birth the zero-initialised last affine map gets gradient; after one step every parameter does."""
    if blueprint is Blueprint.FLEX_ATTENTION and not FLEX_OK:
        pytest.skip(f"flex_attention cannot train here: {FLEX_REASON}")
    torch.manual_seed(0)
    seed = seed_for(blueprint, 16).to(DEVICE)
    x = torch.randn(4, 8, 16, device=DEVICE)
    target = torch.randn(4, 8, 16, device=DEVICE)
    last = seed.last_affine()
    last_params = [last] if isinstance(last, nn.Parameter) else list(last.parameters(recurse=False))
    ((seed(x) - target) ** 2).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in last_params)
    torch.optim.SGD(seed.parameters(), lr=0.1).step()
    seed.zero_grad()
    ((seed(x) - target) ** 2).mean().backward()
    dead = [name for name, p in seed.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not dead, f"{blueprint.key}: no gradient reaches {dead}"


@pytest.mark.parametrize("blueprint", [Blueprint.ATTENTION, Blueprint.FLEX_ATTENTION], ids=lambda b: b.key)
def test_attention_seeds_are_causal(blueprint):
    torch.manual_seed(0)
    seed = seed_for(blueprint, 16)
    with torch.no_grad():
        nn.init.normal_(seed.proj.weight)  # no longer the identity, so the attention shows
        x = torch.randn(2, 10, 16)
        changed = x.clone()
        changed[:, 6] += 1.0
        a, b = seed(x), seed(changed)
    assert torch.equal(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_flex_attention_seed_computes_the_attention_seed():
    """Same weights, same outputs: FlexAttention with a causal block mask is causal SDPA."""
    torch.manual_seed(0)
    sdpa, flex = AttentionSeed(32), FlexAttentionSeed(32)
    with torch.no_grad():
        nn.init.normal_(sdpa.proj.weight)
        flex.load_state_dict(sdpa.state_dict())
        x = torch.randn(2, 12, 32)
        assert torch.allclose(flex(x), sdpa(x), atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled FlexAttention path runs on a GPU only")
def test_flex_attention_seed_on_a_gpu_trains_through_the_compiled_kernel_as_the_attention_seed_does(monkeypatch):
    """On a GPU the seed calls torch.compile's flex_attention (compiled_flex_attention); its outputs and gradients
    are causal SDPA's, and the eager dense reference is not used."""
    from esper_ray.morpho import transformer_blueprints as tb

    monkeypatch.setattr(tb, "eager_flex_attention", lambda *a: pytest.fail("the eager path ran on a GPU"))
    torch.manual_seed(0)
    channels = tb.COMPILED_FLEX_MIN_HEAD_DIM * 4  # 4 heads, each as narrow as the compiled kernel takes
    sdpa, flex = AttentionSeed(channels).cuda(), FlexAttentionSeed(channels).cuda()
    with torch.no_grad():
        nn.init.normal_(sdpa.proj.weight)
    flex.load_state_dict(sdpa.state_dict())
    x = torch.randn(3, 16, channels, device="cuda")
    flex(x).square().sum().backward()
    sdpa(x).square().sum().backward()
    assert torch.allclose(flex(x), sdpa(x), atol=1e-4)
    for (name, a), b in zip(flex.named_parameters(), sdpa.parameters()):  # as a whole: its kernels sum in another order
        assert (a.grad - b.grad).norm() <= 1e-3 * b.grad.norm(), name
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):  # as validation runs it: another batch too
        x = torch.randn(5, 16, channels, device="cuda")
        assert torch.allclose(flex(x).float(), sdpa(x).float(), atol=3e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled FlexAttention path runs on a GPU only")
def test_flex_attention_seed_with_heads_too_narrow_to_compile_runs_eagerly_on_a_gpu(monkeypatch):
    """Inductor cannot lower flex_attention for heads under 16 wide: such a seed (a small task's) trains eagerly."""
    from esper_ray.morpho import transformer_blueprints as tb

    eager, eager_calls = tb.eager_flex_attention, []
    monkeypatch.setattr(tb, "eager_flex_attention", lambda *a: eager_calls.append(1) or eager(*a))
    monkeypatch.setattr(tb, "compiled_flex_attention", lambda: pytest.fail("the compiled path ran for narrow heads"))
    seed = FlexAttentionSeed(16).cuda()  # 4 heads of 4
    seed(torch.randn(2, 8, 16, device="cuda")).sum().backward()
    assert eager_calls and seed.qkv.weight.grad is not None


def test_the_flex_attention_seed_runs_eagerly_without_torch_s_unfused_notice(monkeypatch):
    """Eager is the seed's design (its docstring), so torch's "called without torch.compile" notice is not shown,
    whichever caller is first in the process (a loaded network's forward, say)."""
    import torch.nn.attention.flex_attention as flex_module

    monkeypatch.setattr(
        flex_module, "_WARNINGS_SHOWN", set()
    )  # torch notices once per process: as if this were the first
    seed = FlexAttentionSeed(32)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():  # no CPU backward (flex_attention_available)
        warnings.simplefilter("always")
        seed(torch.randn(2, 12, 32))
    assert [str(w.message) for w in caught] == []
    assert "flex_attention_performance" in flex_module._WARNINGS_SHOWN  # the notice was raised, and filtered


def test_attention_seeds_use_four_heads_or_fewer_that_divide_the_width():
    assert [seed_heads(c) for c in (64, 30, 9, 7)] == [4, 3, 3, 1]
    assert AttentionSeed(30).n_heads == 3


def test_flex_attention_availability_is_reported_with_a_reason():
    ok, reason = flex_attention_available(DEVICE)
    assert isinstance(ok, bool) and "flex_attention" in reason and torch.__version__ in reason
    if ok:
        assert isinstance(build_transformer_seed("flex_attention", 16, DEVICE), FlexAttentionSeed)
    else:
        with pytest.raises(ValueError, match=f"'flex_attention' is not available: .*{DEVICE.type}"):
            build_transformer_seed("flex_attention", 16, DEVICE)
        pytest.skip(f"flex_attention cannot train here: {reason}")


def test_seed_parameter_counts_follow_their_formulas():
    c = 384
    expected = {
        Blueprint.NORM: 2 * c + 1,
        Blueprint.LORA: 2 * c * 8,
        Blueprint.LORA_LARGE: 2 * c * 32,
        Blueprint.ATTENTION: 2 * c + (3 * c * c + 3 * c) + (c * c + c),
        Blueprint.MLP_SMALL: 2 * c + (c * 2 * c + 2 * c) + (2 * c * c + c),
        Blueprint.MLP: 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c),
    }
    assert {b: count_params(build_transformer_seed(b, c)) for b in expected} == expected
    assert count_params(FlexAttentionSeed(c)) == expected[Blueprint.ATTENTION]


def test_unknown_and_cnn_blueprints_are_rejected_with_the_transformer_list():
    available = "norm, attention, lora, lora_large, mlp_small, mlp, flex_attention"
    with pytest.raises(ValueError, match=f"unknown blueprint 'lora_xl'; available: {available}"):
        resolve_transformer_blueprint("lora_xl")
    for cnn_only in set(CNN_BLUEPRINTS) - set(TRANSFORMER_BLUEPRINTS):
        with pytest.raises(
            ValueError, match=f"'{cnn_only.key}' is not available for transformer hosts; available: {available}"
        ):
            build_transformer_seed(cnn_only, 16)
    assert resolve_transformer_blueprint("LoRA") is Blueprint.LORA
    assert resolve_transformer_blueprint(Blueprint.MLP) is Blueprint.MLP


def test_seed_in_a_slot_hook_keeps_the_host_unchanged_at_birth():
    host = small_host()
    seeds = {
        s: build_transformer_seed(b, host.slot_channels(s)) for s, b in zip(host.slot_ids, ("lora", "mlp", "attention"))
    }
    idx = tokens()
    with torch.no_grad():
        assert torch.equal(host(idx, at_slot=lambda s, h: seeds[s](h)), host(idx))


def test_fused_forward_of_a_transformer_equals_one_forward_per_configuration():
    from esper_ray.contracts.actions import Style
    from esper_ray.contracts.lifecycle import LifecycleConfig
    from esper_ray.contracts.stages import Stage
    from esper_ray.morpho.model import MorphogeneticModel
    from tests.morpho_helpers import drive_to, perturbed_for_eval, separate_forward

    torch.manual_seed(0)
    model = MorphogeneticModel(TransformerHost(SMALL), ["r0c0", "r0c1", "r0c2"], LifecycleConfig(auto_forward=False))
    drive_to(model.slot("r0c0"), Stage.FOSSILIZED, blueprint="lora", style=Style.LINEAR_ADD)
    drive_to(model.slot("r0c2"), Stage.HOLDING, blueprint="mlp", style=Style.GATED_GATE)
    perturbed_for_eval(model)
    idx = tokens()
    alphas = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # the plan's main and off:r0c2
    with torch.no_grad():
        fused = model.fused_forward(idx, alphas)
        for k in range(len(alphas)):
            torch.testing.assert_close(fused[k], separate_forward(model, idx, alphas[k]), rtol=1e-5, atol=1e-5)
    assert fused.shape == (2, 3, SMALL.seq_len, 256) and not torch.allclose(fused[0], fused[1])
