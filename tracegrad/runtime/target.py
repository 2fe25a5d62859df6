"""The host target: LLVM initialisation, the TargetMachine, the O3 pipeline and code emission."""
from __future__ import annotations

import functools
import hashlib
import os

import llvmlite.binding as llvm


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def target_machine() -> llvm.TargetMachine:
    _init()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        opt=3, reloc="pic", codemodel="jitdefault")


@functools.cache
def target_id() -> str:
    """What object code depends on besides the IR: triple, CPU and its features."""
    _init()
    feats = llvm.get_host_cpu_features().flatten()
    text = "|".join([llvm.get_process_triple(), llvm.get_host_cpu_name(), feats,
                     str(llvm.llvm_version_info)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def gemm_vector_bits() -> int:
    """The vector width the codegen's GEMMs are written for: 512 on a target with AVX-512,
    where large float matmuls run as tracegrad's packed GEMM (`codegen.linalg.packs`), else
    256 (they call ?gemm). TRACEGRAD_GEMM=blas asks for ?gemm, TRACEGRAD_GEMM=packed for the
    packed GEMM on any target (LLVM splits its vectors where registers are narrower: right,
    and slow; for tests)."""
    choice = os.environ.get("TRACEGRAD_GEMM", "").strip().lower()
    if choice in ("blas", "packed"):
        return 256 if choice == "blas" else 512
    return _host_vector_bits()


@functools.cache
def _host_vector_bits() -> int:
    _init()
    return 512 if "+avx512f" in llvm.get_host_cpu_features().flatten().split(",") else 256


def optimise(ir_text: str, speed: int = 3) -> llvm.ModuleRef:
    """Parse and run the new-pass-manager pipeline with loop and SLP vectorisation."""
    tm = target_machine()
    # A context per module: compiles on two threads (tiering compiles in the background)
    # must not share LLVM's global context, and what one module interns there is never freed.
    mod = llvm.parse_assembly(ir_text, context=llvm.create_context())
    mod.triple = llvm.get_process_triple()
    mod.data_layout = str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=speed)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = False   # full unrolls of short loops cost 4x compile time, no speed
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    mpm.run(mod, pb)
    # llvmlite never frees a ModulePassManager (ObjectRef's no-op _dispose shadows
    # NewPassManager's in the MRO): ~100 KB per compile unless disposed here
    llvm.newpassmanagers.NewPassManager._dispose(mpm)
    mpm.detach()
    return mod


def emit_object(mod: llvm.ModuleRef) -> bytes:
    return target_machine().emit_object(mod)


def emit_assembly(mod: llvm.ModuleRef) -> str:
    return target_machine().emit_assembly(mod)
