# The demo cluster's survey, read and written through gmount:// from outside any mount.
TILES = glob_wildcards(storage.gmount("gmount://demo/inputs/survey/{tile}.txt")).tile


rule all:
    input: storage.gmount("gmount://demo/results/laptop-summary.txt")


rule words:
    input: storage.gmount("gmount://demo/inputs/survey/{tile}.txt")
    output: storage.gmount("gmount://demo/results/laptop/{tile}.words")
    shell: "wc -w < {input} > {output}"


rule summary:
    input: storage.gmount(expand("gmount://demo/results/laptop/{tile}.words", tile=sorted(TILES)))
    output: storage.gmount("gmount://demo/results/laptop-summary.txt")
    shell: "cat {input} > {output}"
