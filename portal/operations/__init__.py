"""Operations: the embedded scheduler, job coordination across processes, job history."""
