"""For scenarios: print the shared-memory files this rank maps (MPI's per-job files, hvlite's
segments), so the test can check that none is left once the job is over, however it ended."""
import os


def report(rank):
    """Print "shm files of rank R: PATH ..." (the /dev/shm files this process maps now)."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(None, 5)[-1].strip().replace(" (deleted)", "")
            if path.startswith("/dev/shm/"):
                paths.add(path)
    print("shm files of rank %d: %s" % (rank, " ".join(sorted(paths))), flush=True)
    return paths


if __name__ == "__main__":
    report(int(os.environ.get("PMI_RANK", "0")))
