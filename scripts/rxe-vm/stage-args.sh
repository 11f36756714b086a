# stage-args.sh: sourced by run-in-vm.sh (and its test).
#
# stage_args DIR ARG...: sets the array `staged` to the ARGs as the VM's guest can use them.
# The guest sees this machine's / read-only but mounts empty tmpfs on /tmp and /run, and it
# starts in the caller's directory only when it can see it. So an ARG that names an existing
# file becomes its absolute path, and one that lives under /tmp or /run (a checkout there,
# or a file named relative to one) is first copied into DIR, which must be somewhere the
# guest sees (run-in-vm.sh's work directory under /var/tmp). Other ARGs pass unchanged.
stage_args() {
  local dir=$1 a abs dst
  shift
  staged=()
  for a in "$@"; do
    if [ -f "$a" ]; then
      abs=$(readlink -f -- "$a")
      case "$abs" in
        /tmp/* | /run/*)
          mkdir -p "$dir"
          dst="$dir/${#staged[@]}-$(basename -- "$abs")"
          cp -p -- "$abs" "$dst"
          abs=$dst
          ;;
      esac
      a=$abs
    fi
    staged+=("$a")
  done
}
