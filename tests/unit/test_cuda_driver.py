"""The engine's CUDA driver binding (csrc/util/cuda_driver.c), on any machine.

The engine declares the driver functions it calls itself (it builds with no CUDA toolkit) and
finds them in libcuda.so.1 at run time. Two things are checked here without a GPU:
- the declarations are NVIDIA's: the file compiles against the toolkit's ``cuda.h`` when one is
  on this machine, where static assertions compare every function-pointer slot with the header's
  prototype of the symbol it is loaded from, and our constants with the header's (skipped, saying
  so, where no ``cuda.h`` is found);
- a process that runs collectives on host memory never loads CUDA (no ``libcuda`` or
  ``libcudart`` mapped afterwards), as a CPU-only user expects.
"""
import os
import subprocess
import sys
import textwrap

import pytest

from c_check import CSRC, compile_c, cuda_header_dir


def test_driver_declarations_match_cuda_h():
    include = cuda_header_dir()
    if include is None:
        pytest.skip("no CUDA toolkit header (cuda.h) on this machine to compare the declarations with")
    compile_c(["-fsyntax-only", "-include", os.path.join(include, "cuda.h"),
               os.path.join(CSRC, "util", "cuda_driver.c")])


def test_host_collectives_never_load_cuda(tmp_path):
    script = tmp_path / "host_only.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import hvlite as hvd
        hvd.init()
        x = np.arange(1 << 16, dtype=np.float32)
        assert np.array_equal(hvd.allreduce(x, op=hvd.Sum), x)
        assert hvd.allgather(x).shape == x.shape
        hvd.shutdown()
        maps = open("/proc/self/maps").read()
        loaded = sorted({line.split()[-1] for line in maps.splitlines() if "libcuda" in line})
        assert not loaded, loaded
        print("no CUDA library mapped")
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no CUDA library mapped" in done.stdout


def test_a_cuda_request_without_a_driver_fails_at_submit(tmp_path):
    """On a machine without the NVIDIA driver, a request in CUDA memory is refused when it is
    submitted, saying why, and the engine goes on with host requests."""
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("this machine has the NVIDIA driver (tests/gpu covers CUDA requests there)")
    script = tmp_path / "no_driver.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import hvlite as hvd
        from hvlite._lib import lib
        from hvlite.handles import NULL, submit
        hvd.init()
        try:
            submit(lib.HVL_ALLREDUCE, "on.gpu", lib.HVL_FLOAT32, (4,), NULL, NULL, None, None,
                   reduce_op=lib.HVL_SUM, memory=lib.HVL_MEMORY_CUDA, device=0)
        except hvd.HvliteError as e:
            print("refused:", e)
        x = np.ones(4, np.float32)
        assert np.array_equal(hvd.allreduce(x, op=hvd.Sum), x)
        assert not lib.hvl_cuda_loaded() and lib.hvl_cuda_built()
        hvd.shutdown()
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("refused: tensor 'on.gpu' is in CUDA memory, but the CUDA driver could not be loaded "
            "(libcuda.so.1") in done.stdout, done.stdout
