"""The registered custom ops match their YAML declarations (yaml/ops.yaml, yaml/backward.yaml)."""

import pathlib

import pytest
from paddle.base import core
from paddle.base.framework import OpProtoHolder

import paddle_fm3.api  # noqa: F401  (loads and registers the ops)
from paddle_fm3_build import codegen  # (from the checkout: conftest.py)

ROOT = pathlib.Path(__file__).resolve().parent.parent
FWD, BWD = codegen.load_decls(ROOT / "yaml")


ATTR_TYPES = {"int": 0, "float": 1, "bool": 6}  # paddle framework.proto AttrType


def expected(decl):
    ins = [a.name + "@OPTIONAL" if a.name in decl.optional else a.name for a in decl.tensors]
    attrs = [(a.name, ATTR_TYPES[a.type]) for a in decl.attrs]
    return ins, attrs, list(decl.outputs)


@pytest.mark.parametrize("name", sorted(FWD))
def test_registered_op_matches_yaml(name):
    proto = OpProtoHolder.instance().get_op_proto(name)
    ins, attrs, outs = expected(FWD[name])
    assert [i.name for i in proto.inputs] == ins
    assert [i.dispensable for i in proto.inputs] == [n.endswith("@OPTIONAL") for n in ins]
    assert [(a.name, a.type) for a in proto.attrs if a.name in dict(attrs)] == attrs
    assert [o.name for o in proto.outputs] == outs


@pytest.mark.parametrize("name", sorted(FWD))
def test_grad_op_registered_exactly_where_declared(name):
    assert core.has_grad_op_maker(name) == (FWD[name].backward is not None)


def test_backward_declaration_mirrors_forward():
    for decl in (d for d in BWD.values() if d.forward == "fm3_flashmask_attention"):
        fwd = FWD[decl.forward]
        tensors = [a.name for a in decl.tensors]
        # The grad op sees the forward inputs, the forward outputs and their grads.
        assert tensors == [a.name for a in fwd.tensors] + fwd.outputs + ["out_grad"]
        assert [a.name for a in decl.attrs] == [a.name for a in fwd.attrs]
        assert decl.outputs == [a.name + "_grad" for a in fwd.tensors if a.name in ("q", "k", "v", "learnable_sink")]


def test_standalone_backward_op_is_the_grad_op():
    """fm3_flashmask_attention_bwd (callers with their own lse, e.g. CP) takes and returns what the
    generated grad op does, the learnable sink and its gradient included."""
    op, grad = FWD["fm3_flashmask_attention_bwd"], BWD["fm3_flashmask_attention_grad"]
    assert (op.args, op.outputs, op.optional, op.kernel) == (grad.args, grad.outputs, grad.optional, grad.kernel)
    assert "learnable_sink" in [a.name for a in op.tensors] and "learnable_sink" not in op.optional
    assert op.outputs[-1] == "learnable_sink_grad"


def test_no_second_derivative_is_declared_for_both_backwards():
    """The grad op's grad (Paddle's double grad) and the standalone backward's grad are declared, with
    the kernel that raises; registered as gradients of the gradients (Grad(Grad(q)) and Grad(q_grad))."""
    double, bwd_grad = BWD["fm3_flashmask_attention_double_grad"], BWD["fm3_flashmask_attention_bwd_grad"]
    assert BWD["fm3_flashmask_attention_grad"].backward == double.name
    assert FWD["fm3_flashmask_attention_bwd"].backward == bwd_grad.name
    assert double.kernel == bwd_grad.kernel == "FlashmaskAttentionNoSecondDerivative"
    assert (double.level, double.root, bwd_grad.level, bwd_grad.root) == (
        2, "fm3_flashmask_attention", 1, "fm3_flashmask_attention_bwd")
    text = codegen.gen_op(double)
    assert "PD_BUILD_DOUBLE_GRAD_OP(fm3_flashmask_attention)" in text
    assert 'paddle::Grad(paddle::Grad("q"))' in text and 'Outputs({paddle::Grad(paddle::Grad("out"))})' in text
    text = codegen.gen_op(bwd_grad)
    assert "PD_BUILD_GRAD_OP(fm3_flashmask_attention_bwd)" in text and 'paddle::Grad("q_grad")' in text


def test_generated_sources_are_current(tmp_path):
    """The generator is deterministic and the build used today's YAML."""
    codegen.generate(tmp_path)
    built = ROOT / "build" / "generated" / "fm3_ops_generated.cc"
    if built.exists():
        assert built.read_text() == (tmp_path / "fm3_ops_generated.cc").read_text()
