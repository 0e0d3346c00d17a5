"""The build of paddle_fm3 (not installed with it): what setup.py and the developer builds share.

- recipe.py: the one build definition: sources, include folders and compiler flags of the Paddle op,
  of libfm3_cuda.so (the Hopper kernels behind their C ABI) and of the DLPack module;
- codegen.py: code generation from yaml/ (the op registration, the kernel-config tables);
- kernel_rules.py: which tile configs the Hopper kernels serve;
- __main__.py: the command line (python -m paddle_fm3_build), under scripts/gpu_build.sh and
  scripts/build_dlpack_ext.sh.
"""
