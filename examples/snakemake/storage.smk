# The demo cluster's survey, read and written through gmount:// from outside any mount.
# The cluster: `snakemake --config cluster=NAME` (default: demo, the cluster of `nox -s demo`).
# Each output lands on the node holding most of its job's inputs (--storage-gmount-node N: on N).

CLUSTER = config.get("cluster", "demo")


def gmount(path):
    """A file of the cluster, by its path in the namespace."""
    return storage.gmount(f"gmount://{CLUSTER}/{path}")


TILES = glob_wildcards(gmount("inputs/survey/{tile}.txt")).tile


rule all:
    input: gmount("results/laptop-summary.txt")


rule words:
    input: gmount("inputs/survey/{tile}.txt")
    output: gmount("results/laptop/{tile}.words")
    shell: "wc -w < {input} > {output}"


rule summary:
    input: [gmount(f"results/laptop/{tile}.words") for tile in sorted(TILES)]
    output: gmount("results/laptop-summary.txt")
    shell: "cat {input} > {output}"
