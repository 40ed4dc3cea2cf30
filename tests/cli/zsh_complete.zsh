# What zsh completes for a command line: zsh -f zsh_complete.zsh FUNCTION_DIR 'LINE'. An interactive zsh
# on a pseudo-terminal (zsh/zpty) with FUNCTION_DIR in $fpath and compinit run, as a user's would be;
# compadd is wrapped to print each match it is given, the line is typed with a TAB, and the matches are
# read back until the completion is over (comppostfuncs). The markers are written split in the commands
# so that the terminal's echo of them is never taken for output.
zmodload zsh/zpty || exit 3
fp=$1; line=$2
zpty z zsh -f -i
zpty -w z "PROMPT=''; RPROMPT=''; fpath=($fp \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compadd () { local -a __hits; builtin compadd -O __hits "$@"; (( $#__hits )) && print -rl -- "<h""it>"${^__hits}; builtin compadd "$@"; }'
zpty -w z "zstyle ':completion:*' list-prompt ''; comppostfuncs=(__done); __done () { print -r -- '<do''ne>' }"
zpty -w z "${line}"$'\t'
out=''
integer start=$SECONDS
while (( SECONDS - start < 30 )); do
  if zpty -r -t z chunk; then out+=$chunk; else sleep 0.05; fi
  [[ $out == *'<done>'* ]] && break
done
zpty -d z
[[ $out == *'<done>'* ]] || exit 4
print -r -- "${out//$'\r'/}" | grep -o '<hit>[^[:space:]]*' | sed 's/<hit>//' | sort -u
