"""Operations over the whole cluster: up/down, the lab, GraySort, jobs and sweeps."""
