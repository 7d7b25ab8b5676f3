"""``hydra/launcher=slurm``: Hydra's submitit SLURM launcher, collecting its jobs one by one
(``theseus.cli.slurm`` says why; theseus is imported only when a job runs or ends)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


class SlurmLauncher(SubmititSlurmLauncher):
    """Hydra's submitit SLURM launcher, with the results collected job by job: a job that
    ends without a result (``scancel``, a time limit reached) is recorded as preempted."""

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict) -> JobReturn:
        """Run the job (in the SLURM job); a stop on a signal records it as preempted (the
        ``SystemExit`` goes on: submitit writes no result, so SLURM's requeue runs it again)."""
        try:
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        except SystemExit as stop:
            from theseus.cli.slurm import record_preempted

            record_preempted(self._job_dir(sweep_overrides, job_num), f"stopped by a signal (exit code {stop.code})")
            raise

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        # Hydra's launch submits, then collects with job.results(), which raises for a job that
        # ended without a result: the jobs submitted are kept and collected here instead.
        submitted = []
        real_map = submitit.AutoExecutor.map_array

        def keep(executor, *args, **kwargs):
            submitted.extend(real_map(executor, *args, **kwargs))
            return []

        submitit.AutoExecutor.map_array = keep
        try:
            super().launch(job_overrides, initial_job_idx)
        finally:
            submitit.AutoExecutor.map_array = real_map
        return [self._result(job, initial_job_idx + i, overrides) for i, (job, overrides)
                in enumerate(zip(submitted, job_overrides))]

    def _result(self, job: Any, num: int, overrides: Sequence[str]) -> JobReturn:
        """The job's JobReturn once it has ended (requeues followed: submitit waits through them)."""
        from submitit.core.utils import UncompletedJobError

        from theseus.cli.slurm import stopped

        try:
            return job.results()[0]
        except UncompletedJobError:
            return stopped(job, self._job_dir(overrides, num), overrides)

    def _job_dir(self, overrides: Sequence[str], num: int) -> Path:
        """Job ``num``'s folder, as Hydra's ``run_job`` makes it (``hydra.sweep.dir/subdir``)."""
        from omegaconf import open_dict

        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(config.hydra.job):
            config.hydra.job.num = num
        return Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
