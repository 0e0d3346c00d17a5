"""tools/gpu_env.sh: the device scripts' argument strings keep their quotes (a pytest -k expression)."""
import os
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shell_words(text, tmp_path):
    """The words as the scripts get them: '<count>:<word><word>...'."""
    script = ('source tools/gpu_env.sh; mapfile -t a < <(shell_words "$1"); '
              'printf "%d:" "${#a[@]}"; printf "<%s>" "${a[@]}"')
    out = subprocess.run(["bash", "-c", script, "_", text], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"OUT": str(tmp_path), "PATH": os.environ["PATH"]})
    return out.stdout


def test_a_quoted_expression_stays_one_argument(tmp_path):
    assert shell_words('-q -x tests/gpu/test_flashmask_bwd_gpu.py -k "d80 or d96"', tmp_path) == \
        "5:<-q><-x><tests/gpu/test_flashmask_bwd_gpu.py><-k><d80 or d96>"
    assert shell_words("-k 'd80 or d96'", tmp_path) == "2:<-k><d80 or d96>"


def test_plain_words_and_nothing(tmp_path):
    assert shell_words("--bwd  --head-dims 80,128", tmp_path) == "3:<--bwd><--head-dims><80,128>"
    assert shell_words("   ", tmp_path) == "0:<>"  # no words (printf prints its format once)
