#!/usr/bin/env bash
# Print the home of a JDK for PySpark 4.x (Java 17 preferred, 21 accepted), or nothing.
# The Makefile uses this when JAVA_HOME is unset; an already set JAVA_HOME is left alone.
set -uo pipefail

is_jdk() { [[ -x $1/bin/java ]]; }

# Debian/Ubuntu packages, Temurin and other vendors' directory names, newest patch last.
for version in 17 21; do
    for dir in /usr/lib/jvm/java-"$version"-openjdk* /usr/lib/jvm/temurin-"$version"* \
        /usr/lib/jvm/*-"$version"-* /usr/lib/jvm/jdk-"$version"* /usr/lib/jvm/java-"$version"*; do
        if is_jdk "$dir"; then
            echo "$dir"
            exit 0
        fi
    done
    # macOS
    if [[ -x /usr/libexec/java_home ]] && dir=$(/usr/libexec/java_home -v "$version" 2>/dev/null); then
        echo "$dir"
        exit 0
    fi
done

# Fall back to whatever `java` is on PATH.
if java=$(command -v java); then
    dir=$(readlink -f "$java")
    echo "${dir%/bin/java}"
fi
