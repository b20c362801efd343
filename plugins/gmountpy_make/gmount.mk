# gmount.mk -- run every recipe on the gmount node that holds its prerequisites.
#
#     include $(shell gmount make-include)
#
# is the whole change to a Makefile (or run `gmount make [ARGS]` with none).
# make hands each recipe to gmount-job (SHELL, a small C program installed
# beside this file) together with its target and prerequisites; gmount-job asks
# the node daemon of the mount make runs in which node holds them (`place($^)`)
# and runs the recipe with /bin/sh there, in the same directory of that node's
# mount. Recipes for nodes on other machines (SSH clusters), and any recipe
# when the daemon has no job socket, go through the Python gmount-sh. $(shell ...)
# runs on this machine's mount as before. Recipes see GMOUNT_NODE, GMOUNT_SITE,
# GMOUNT_CLUSTER and GMOUNT_PLACEMENT_LOG.
#
# Settings (set them before the include, on the command line or in the environment):
#   GMOUNT_PLACEMENT_LOG  JSON lines, one per recipe (default: .gmount/make-<time>-<pid>.jsonl here)
#   GMOUNT_RECIPE_SHELL   the shell recipes run in on their node (default /bin/sh)
#   GMOUNT_SH             the wrapper (default: gmount-job beside this file, else the Python gmount-sh)
#   GMOUNT_SH_FALLBACK    the Python gmount-sh (default: installed beside this file's Python, else on PATH)

ifndef GMOUNT_MK_INCLUDED
GMOUNT_MK_INCLUDED := 1
# This file's directory, taken now: later includes (a generated diffs.mk, ...) change MAKEFILE_LIST.
GMOUNT_MK_DIR := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))/

# One log per run of make: sub-makes inherit it through the environment.
# (Computed here, before SHELL is set, so this $(shell) is plain /bin/sh.)
ifeq ($(origin GMOUNT_PLACEMENT_LOG),undefined)
GMOUNT_PLACEMENT_LOG := $(CURDIR)/.gmount/make-$(shell date +%Y%m%dT%H%M%S-$$PPID).jsonl
endif
export GMOUNT_PLACEMENT_LOG

GMOUNT_RECIPE_SHELL ?= /bin/sh
export GMOUNT_RECIPE_SHELL

# This file is <prefix>/lib/pythonX.Y/site-packages/gmountpy_make/gmount.mk in
# a normal install, so the Python wrapper is <prefix>/bin/gmount-sh; else use PATH.
GMOUNT_SH_FALLBACK ?= $(or $(abspath $(wildcard $(GMOUNT_MK_DIR)../../../../bin/gmount-sh)),gmount-sh)
export GMOUNT_SH_FALLBACK
GMOUNT_SH ?= $(or $(wildcard $(GMOUNT_MK_DIR)gmount-job),$(GMOUNT_SH_FALLBACK))

# `=`, not `:=`: $@ and $^ must be expanded per recipe, when make runs it.
export GMOUNT_TARGET = $@
export GMOUNT_DEPS = $^
SHELL = $(GMOUNT_SH)
endif
