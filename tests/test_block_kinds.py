"""Block kinds and type labels: hybrid stacks (attention, state-space scans, experts) are labelled apart."""

from __future__ import annotations

from planner.graph.block_kinds import TypeFacts, block_kind, labels, mixer

ATTENTION = {"MatMul", "Softmax", "Mul", "Add"}
SSM = {"MatMul", "Conv", "Softplus", "Exp", "Mul", "Add"}
ROUTER = {"Softmax", "TopK"}


def _layer(name: str, ops: set[str], params: tuple[str, ...] = ("w",)) -> TypeFacts:
    return TypeFacts(names=(name,), stack="model.layers", kind=block_kind(ops, params, [2]), mixer=mixer(ops))


def test_a_scan_is_an_ssm_layer_and_experts_make_a_moe_layer_whatever_mixes_tokens():
    assert (block_kind(SSM, ("w",), [2]), mixer(SSM)) == ("ssm", "ssm")
    assert (block_kind(ATTENTION, ("w",), [2]), mixer(ATTENTION)) == ("attention", "attention")
    assert (block_kind(SSM | ROUTER, ("w",), [2]), mixer(SSM | ROUTER)) == ("moe", "ssm")
    assert block_kind({"Conv", "Add"}, ("w",), [4]) == "conv"  # a conv without the scan's step and decay


def test_jamba_like_stack_gets_one_label_per_layer_type():
    types = [_layer("model.layers.0", SSM | ROUTER), _layer("model.layers.1", ATTENTION),
             _layer("model.layers.2", SSM), _layer("model.layers.3", ATTENTION | ROUTER),
             TypeFacts(names=("lm_head",), stack=None, kind="mlp", mixer="")]
    assert labels(types) == ["model.layers[ssm+moe]", "model.layers[attention+dense]", "model.layers[ssm+dense]",
                             "model.layers[attention+moe]", "lm_head"]


def test_one_mixer_keeps_dense_and_moe_tags_and_numbers_what_still_collides():
    assert labels([_layer("a", ATTENTION), _layer("b", ATTENTION | ROUTER)]) == [
        "model.layers[dense]", "model.layers[moe]"]
    assert labels([_layer("a", ATTENTION), _layer("b", ATTENTION | {"Where"}), _layer("c", ATTENTION | ROUTER)]) == [
        "model.layers[dense1]", "model.layers[dense2]", "model.layers[moe]"]
    assert labels([_layer("a", ATTENTION), _layer("b", SSM)]) == ["model.layers[attention]", "model.layers[ssm]"]
    assert labels([_layer("a", SSM)]) == ["model.layers (SSM layer)"]
