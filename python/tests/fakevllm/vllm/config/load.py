"""vllm/config/load.py:25 LoadConfig, the fields the loaders read."""

import dataclasses


@dataclasses.dataclass
class LoadConfig:
    load_format: str = "auto"
    download_dir: str | None = None
    safetensors_load_strategy: str | None = None
    safetensors_prefetch_num_threads: int = 8
    safetensors_prefetch_block_size: int = 16 * 1024 * 1024
    model_loader_extra_config: dict = dataclasses.field(default_factory=dict)
    device: str | None = None
    ignore_patterns: list = dataclasses.field(default_factory=lambda: ["original/**/*"])
    use_tqdm_on_load: bool = True
    pt_load_map_location: str = "cpu"

    def __post_init__(self):
        # load.py:135 _lowercase_load_format
        self.load_format = self.load_format.lower()
