# Copies the shared libraries a helper depends on, whose names match PATTERN, beside it, under
# their sonames. The private helpers (libvaswap_yaml.so, libvaswap_unwind.so) carry RUNPATH
# $ORIGIN, so a libvaswap.so directory moved to another machine (the GPU machine has no
# yaml-cpp or libunwind) brings what they need.
#   cmake -DLIB=<helper.so> -DDEST=<dir> -DPATTERN=<regex> -P bundle_deps.cmake
execute_process(COMMAND ldd ${LIB} OUTPUT_VARIABLE listing RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ldd ${LIB} failed")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(found FALSE)
foreach(line IN LISTS lines)
  if(line MATCHES "^[ \t]*((${PATTERN})[^ ]*) => ([^ ]+)")
    set(soname ${CMAKE_MATCH_1})
    set(resolved ${CMAKE_MATCH_3})
    if(NOT resolved STREQUAL "${DEST}/${soname}")
      file(COPY_FILE ${resolved} ${DEST}/${soname} ONLY_IF_DIFFERENT)
    endif()
    set(found TRUE)
  endif()
endforeach()
if(NOT found)
  message(FATAL_ERROR "${LIB} depends on nothing matching ${PATTERN}:\n${listing}")
endif()
