import pytest

from scorer_container.settings import ScorerSettings


def test_sagemaker_llama_cpp_variables_map_to_engine_settings():
    settings = ScorerSettings.from_env(
        {
            "SM_LLAMA_CPP_MODEL": "/opt/ml/model/m.gguf",
            "SM_LLAMA_CPP_CTX_SIZE": "8192",
            "SM_LLAMA_CPP_N_GPU_LAYERS": "999",
            "SM_LLAMA_CPP_THREADS": "4",
            "SM_LLAMA_CPP_BATCH_SIZE": "1024",
            "SM_LLAMA_CPP_PARALLEL": "16",
            "SM_LLAMA_CPP_FLASH_ATTN": "on",
            "SM_LLAMA_CPP_NO_MMAP": "true",
            "SM_LLAMA_CPP_READOUT": "letters",
            "SM_LLAMA_CPP_API_KEY_FILE": "/secret",
            "SCORER_MAX_WAITING": "2",
        }
    )
    runtime = settings.runtime
    assert settings.model == "/opt/ml/model/m.gguf"
    assert (runtime.n_ctx, runtime.n_gpu_layers, runtime.n_threads, runtime.n_batch) == (8192, 999, 4, 1024)
    assert runtime.n_seq_max == 16 and runtime.flash_attn and not runtime.use_mmap
    assert settings.readout == "letters" and settings.max_waiting == 2
    # Unknown options are reported by name (never by value) and ignored.
    assert settings.ignored_options == ("api-key-file",)


def test_a_false_flag_keeps_the_default():
    assert ScorerSettings.from_env({"SM_LLAMA_CPP_NO_MMAP": "false"}).runtime.use_mmap


@pytest.mark.parametrize("env", [{"SM_LLAMA_CPP_CTX_SIZE": "big"}, {"SM_LLAMA_CPP_READOUT": "vibes"}])
def test_bad_values_are_refused(env):
    with pytest.raises(ValueError):
        ScorerSettings.from_env(env)
