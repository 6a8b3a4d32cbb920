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
            "SCORER_MAX_JOBS": "6",
            "SCORER_MAX_RESIDENT": "3",
            "SCORER_TENANT_SHARE": "1",
            "SCORER_LONG_SHARE": "0.4",
            "SCORER_CONTEXT_JOBS": "3",
        }
    )
    llama = settings.llama
    assert settings.model == "/opt/ml/model/m.gguf"
    assert (llama.n_ctx, llama.n_gpu_layers, llama.n_threads, llama.n_batch) == (8192, 999, 4, 1024)
    assert llama.n_seq_max == 16 and llama.flash_attn and not llama.use_mmap
    assert settings.readout == "letters" and (settings.max_jobs, settings.max_resident) == (6, 3)
    assert (settings.tenant_share, settings.long_share, llama.context_jobs) == (1.0, 0.4, 3)
    # Unknown options are reported by name (never by value) and ignored.
    assert settings.ignored_options == ("api-key-file",)


def test_a_false_flag_keeps_the_default():
    assert ScorerSettings.from_env({"SM_LLAMA_CPP_NO_MMAP": "false"}).llama.use_mmap


@pytest.mark.parametrize("env", [{"SM_LLAMA_CPP_CTX_SIZE": "big"}, {"SM_LLAMA_CPP_READOUT": "vibes"},
                                 {"SCORER_MAX_JOBS": "0"}, {"SCORER_TENANT_SHARE": "0"}, {"SCORER_LONG_SHARE": "1"},
                                 {"SCORER_LONG_SHARE": "nan"}, {"SCORER_CONTEXT_JOBS": "0"}, {"SCORER_STEP_S": "0"},
                                 {"SM_LLAMA_CPP_PARALLEL": "256"},
                                 {"SM_LLAMA_CPP_PARALLEL": "128", "SM_LLAMA_CPP_BATCH_SIZE": "64"}])
def test_bad_values_are_refused(env):
    with pytest.raises(ValueError):
        ScorerSettings.from_env(env)


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("route=systemone;timeout_ms=1500", 1.5),
        ("timeout_ms=999999999", 58.0),  # never past the ceiling
        ("route=chat", 58.0),
        ("timeout_ms=²", 58.0),  # a Unicode digit is not a number of milliseconds
        ("timeout_ms=-5", 58.0),
        ("timeout_ms=1e9", 58.0),
        ("timeout_ms=0", 58.0),  # no time left is no deadline given (systemone.sidechannel.timeout_of)
        ("timeout_ms=12345678901234567890", 58.0),
    ],
)
def test_the_callers_deadline_comes_from_the_custom_attributes(header, seconds):
    from systemone.sidechannel import parse_attributes, timeout_of

    assert timeout_of(parse_attributes(header), 58.0) == seconds


@pytest.mark.parametrize("name", ["SCORER_MAX_REQUEST_TOKENS", "SCORER_BUDGET_S", "SCORER_DEADLINE_S"])
@pytest.mark.parametrize("raw", ["0", "-1", "lots"])
def test_work_limits_must_be_positive_numbers(name, raw):
    with pytest.raises(ValueError, match=name):
        ScorerSettings.from_env({name: raw})


def test_the_temperature_comes_from_the_manifest_unless_the_deployment_sets_one():
    assert ScorerSettings.from_env({}).temperature is None
    assert ScorerSettings.from_env({"SCORER_TEMPERATURE": " "}).temperature is None
    assert ScorerSettings.from_env({"SCORER_TEMPERATURE": "0.8"}).temperature == 0.8


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf", "25", "warm"])
def test_a_temperature_outside_0_05_to_20_is_refused(raw):
    with pytest.raises(ValueError, match="SCORER_TEMPERATURE"):
        ScorerSettings.from_env({"SCORER_TEMPERATURE": raw})


@pytest.mark.parametrize(
    ("header", "tenant", "work", "weight"),
    [
        ("tenant=ABCdef0123;work=LONG;weight=2.5", "abcdef0123", "long", 2.5),
        ("tenant=not-hex!;work=urgent;weight=nan", "", "ordinary", 1.0),  # malformed: the shared lane, ordinary, 1
        ("tenant=" + "a" * 65 + ";weight=inf", "", "ordinary", 1.0),  # too long a tag; an infinite weight
        ("weight=1e9", "", "ordinary", 100.0),  # clamped, never a lane that takes every turn
        ("weight=-3;work=bulk", "", "bulk", 0.1),
        ("weight=" + "9" * 40, "", "ordinary", 1.0),
        ("tenant=;work=;weight=", "", "ordinary", 1.0),
    ],
)
def test_whose_work_it_is_comes_from_the_custom_attributes_and_anything_malformed_is_no_claim(header, tenant, work,
                                                                                              weight):
    from systemone.sidechannel import parse_attributes, tenant_of, weight_of, work_of

    pairs = parse_attributes(header)
    assert (tenant_of(pairs), work_of(pairs), weight_of(pairs)) == (tenant, work, weight)
