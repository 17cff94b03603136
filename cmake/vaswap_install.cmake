# What `cmake --install` puts where, by component. The wheel (pyproject.toml) is the same install
# with only runtime and python, into the package directory. docs/BUILD.md shows both layouts.
#
#   runtime      libvaswap.so, its private helpers and     lib/
#                their bundled dependencies
#   python       the vaswap package (binding, command      share/vaswap/python/vaswap/   (wheel: vaswap/)
#                line, report, the TRACE.md it reads)
#   launcher     the vaswap command                         bin/vaswap                    (wheel: an entry point)
#   development  the C API header, the CMake package       include/vaswap/, lib/cmake/vaswap/, lib/pkgconfig/
#                (find_package(vaswap)), vaswap.pc
#
# The simulator, the tests and the examples are never installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# ---------------------------------------------------------------------------------------------
# runtime: the preload and what it opens from its own directory (core/base/private_library.cpp)
# ---------------------------------------------------------------------------------------------
# The helpers keep RUNPATH $ORIGIN (their INSTALL_RPATH), so the copies of yaml-cpp and libunwind
# that cmake/bundle_deps.cmake put beside them in the build travel with them.
install(TARGETS vaswap EXPORT vaswapTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS vaswap_yaml vaswap_unwind LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
# The patterns are those the helpers' POST_BUILD bundling copies (config/, core/CMakeLists.txt).
install(DIRECTORY ${CMAKE_BINARY_DIR}/lib/ DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
  FILES_MATCHING PATTERN "libyaml-cpp.so*" PATTERN "libunwind.so*")

# ---------------------------------------------------------------------------------------------
# python and launcher
# ---------------------------------------------------------------------------------------------
# A wheel is installed with the package directory as its prefix (pyproject.toml:
# wheel.install-dir), so there the package files are the prefix itself. bin/vaswap looks for the
# package at share/vaswap/python (scripts/vaswap).
if(SKBUILD)
  set(VASWAP_INSTALL_PYTHONDIR .)
else()
  set(VASWAP_INSTALL_PYTHONDIR share/vaswap/python/vaswap)
endif()
# _installed.py tells the package where its library is, relative to itself, and its version;
# a checkout has no such file and uses build/plain (python/vaswap/_layout.py).
file(RELATIVE_PATH VASWAP_LIBRARY_DIR_FROM_PACKAGE
  ${CMAKE_INSTALL_PREFIX}/${VASWAP_INSTALL_PYTHONDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
if(VASWAP_LIBRARY_DIR_FROM_PACKAGE STREQUAL "")
  set(VASWAP_LIBRARY_DIR_FROM_PACKAGE .)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/_installed.py.in ${CMAKE_BINARY_DIR}/python/_installed.py @ONLY)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/vaswap/ DESTINATION ${VASWAP_INSTALL_PYTHONDIR}
  COMPONENT python FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
install(FILES ${CMAKE_BINARY_DIR}/python/_installed.py ${PROJECT_SOURCE_DIR}/docs/TRACE.md
  DESTINATION ${VASWAP_INSTALL_PYTHONDIR} COMPONENT python)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/vaswap DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT launcher)

# ---------------------------------------------------------------------------------------------
# development: vaswap.h, find_package(vaswap) -> vaswap::vaswap, pkg-config vaswap
# ---------------------------------------------------------------------------------------------
install(FILES ${PROJECT_SOURCE_DIR}/include/vaswap/vaswap.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/vaswap COMPONENT development)
set(VASWAP_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/vaswap)
install(EXPORT vaswapTargets NAMESPACE vaswap:: DESTINATION ${VASWAP_INSTALL_CMAKEDIR}
  COMPONENT development)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/vaswapConfig.cmake.in
  ${CMAKE_BINARY_DIR}/cmake/vaswapConfig.cmake INSTALL_DESTINATION ${VASWAP_INSTALL_CMAKEDIR})
# 0.x: a new minor version may change the C API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/vaswapConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/vaswapConfig.cmake ${CMAKE_BINARY_DIR}/cmake/vaswapConfigVersion.cmake
  DESTINATION ${VASWAP_INSTALL_CMAKEDIR} COMPONENT development)
# vaswap.pc finds its prefix from its own directory, so the prefix can move.
file(RELATIVE_PATH VASWAP_PREFIX_FROM_PKGCONFIG ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" VASWAP_PREFIX_FROM_PKGCONFIG "${VASWAP_PREFIX_FROM_PKGCONFIG}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/vaswap.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/vaswap.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/vaswap.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT development)
